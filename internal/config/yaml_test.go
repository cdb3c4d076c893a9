package config

import (
	"errors"
	"io"
	"strings"
	"testing"
)

func TestDecodeStrict(t *testing.T) {
	type doc struct {
		Name string `yaml:"name"`
	}
	for _, tt := range []struct {
		in, want string // want: "" ok, "EOF" empty, else part of the error
		name     string
	}{
		{in: "name: a\n", name: "a"},
		{in: "", want: "EOF"},
		{in: "# only a comment\n", want: "EOF"},
		{in: "nmae: a\n", want: "field nmae not found"},
		{in: "name: a\n---\nname: b\n", want: "line 2: more than one YAML document"},
		{in: "name: a\n---\n: [\n", want: "yaml:"},
		{in: "name: [\n", want: "yaml:"},
	} {
		var d doc
		err := DecodeStrict([]byte(tt.in), &d)
		switch {
		case tt.want == "" && (err != nil || d.Name != tt.name):
			t.Errorf("%q: %+v, %v", tt.in, d, err)
		case tt.want == "EOF" && !errors.Is(err, io.EOF):
			t.Errorf("%q: %v, want io.EOF", tt.in, err)
		case tt.want != "" && tt.want != "EOF" && (err == nil || !strings.Contains(err.Error(), tt.want)):
			t.Errorf("%q: %v, want it to say %q", tt.in, err, tt.want)
		}
	}
}
