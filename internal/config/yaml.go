package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"

	"gopkg.in/yaml.v3"
)

// DecodeStrict decodes exactly one YAML document into v. Unknown keys are
// errors (a misspelt key must not silently become a default), and so is a
// second document (it would be ignored). Empty input returns an error
// wrapping io.EOF: callers decide whether that means all defaults.
func DecodeStrict(data []byte, v any) error {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(v); err != nil {
		return err
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err == nil {
		return fmt.Errorf("line %d: more than one YAML document", extra.Line)
	} else if !errors.Is(err, io.EOF) {
		return err
	}
	return nil
}
