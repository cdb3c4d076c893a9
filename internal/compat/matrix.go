// Package compat is the driver/firmware compatibility matrix: which driver
// versions a GPU model allows, which Fabric Manager goes with a driver, the
// minimum HCA firmware, RDMA stack and kernel ranges, and known-bad
// combinations. It answers both "is this node's combination allowed?" and
// "would this TARGET version be allowed on this node?".
//
// The file format is documented in docs/matrix.md.
package compat

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"

	"gopkg.in/yaml.v3"
)

// ErrInvalid wraps every error about a matrix's content.
var ErrInvalid = errors.New("invalid compatibility matrix")

// Matrix is a parsed, validated compatibility matrix. The zero value has no
// rules; use Parse, Load or YAML decoding to build one.
type Matrix struct {
	gpus     []gpuRule
	fabric   []fmRule
	hcas     []hcaRule
	rdma     stackList
	rdmaRef  ruleRef
	kernels  specList
	kernRef  ruleRef
	knownBad []badRule
}

// ruleRef names a rule in messages: "gpus[0] at line 12".
type ruleRef struct {
	path string
	line int
}

func (r ruleRef) String() string {
	if r.line > 0 {
		return fmt.Sprintf("%s at line %d", r.path, r.line)
	}
	return r.path
}

type gpuRule struct {
	ref     ruleRef
	model   matcher
	drivers specList
	cuda    specList
	vbios   specList
	reason  string
	source  string
}

type fmRule struct {
	ref      ruleRef
	driver   spec
	gpuModel *matcher
	same     bool // FM must equal the driver version exactly
	version  spec // when !same
	reason   string
	source   string
}

type hcaRule struct {
	ref      ruleRef
	model    matcher
	name     string // "ConnectX-7", for messages
	minFW    string
	firmware specList
	reason   string
	source   string
}

type badRule struct {
	ref    ruleRef
	when   badWhen
	reason string
	source string
}

// badWhen holds a known-bad rule's conditions; nil fields are not part of it.
type badWhen struct {
	gpuModel      *matcher
	vbios         *spec
	driver        *spec
	cuda          *spec
	fabricManager *spec
	kernel        *spec
	rdmaStack     *stackSpec
	hcaModel      *matcher
	hcaFirmware   *spec
}

// Load reads and validates a matrix file.
func Load(path string) (*Matrix, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read matrix: %w", err)
	}
	m, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return m, nil
}

// Parse reads and validates a matrix document.
func Parse(data []byte) (*Matrix, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("%w: empty document", ErrInvalid)
		}
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err == nil {
		return nil, fmt.Errorf("%w: line %d: more than one YAML document", ErrInvalid, extra.Line)
	} else if !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	root := &doc
	if root.Kind == yaml.DocumentNode {
		if len(root.Content) == 0 {
			return nil, fmt.Errorf("%w: empty document", ErrInvalid)
		}
		root = root.Content[0]
	}
	m := &Matrix{}
	if err := m.decode(root); err != nil {
		return nil, err
	}
	return m, nil
}

// UnmarshalYAML lets a matrix sit inline under `matrix:` in a config. It
// applies the same strict validation as Parse whatever the caller's decoder
// settings.
func (m *Matrix) UnmarshalYAML(n *yaml.Node) error {
	var parsed Matrix
	if err := parsed.decode(n); err != nil {
		return err
	}
	*m = parsed
	return nil
}

// decode fills m from a mapping node and validates it.
func (m *Matrix) decode(n *yaml.Node) error {
	d := &decoder{budget: maxNodes}
	top, err := d.mapping(n, "matrix", topKeys)
	if err != nil {
		return err
	}
	if len(top) == 0 {
		return d.errf(n, "matrix", "no rules (want at least one of %s)", keyList(topKeys))
	}
	for _, kv := range top {
		var err error
		switch kv.key {
		case "gpus":
			err = d.seq(kv.val, "gpus", func(i int, e *yaml.Node) error {
				r, err := d.gpuRule(e, fmt.Sprintf("gpus[%d]", i))
				m.gpus = append(m.gpus, r)
				return err
			})
		case "fabric_manager":
			err = d.seq(kv.val, "fabric_manager", func(i int, e *yaml.Node) error {
				r, err := d.fmRule(e, fmt.Sprintf("fabric_manager[%d]", i))
				m.fabric = append(m.fabric, r)
				return err
			})
		case "hcas":
			err = d.seq(kv.val, "hcas", func(i int, e *yaml.Node) error {
				r, err := d.hcaRule(e, fmt.Sprintf("hcas[%d]", i))
				m.hcas = append(m.hcas, r)
				return err
			})
		case "rdma_stacks":
			m.rdmaRef = ruleRef{"rdma_stacks", kv.val.Line}
			m.rdma, err = d.stackList(kv.val, "rdma_stacks")
		case "kernels":
			m.kernRef = ruleRef{"kernels", kv.val.Line}
			m.kernels, err = d.specList(kv.val, "kernels")
		case "known_bad":
			err = d.seq(kv.val, "known_bad", func(i int, e *yaml.Node) error {
				r, err := d.badRule(e, fmt.Sprintf("known_bad[%d]", i))
				m.knownBad = append(m.knownBad, r)
				return err
			})
		}
		if err != nil {
			return err
		}
	}
	return nil
}

var (
	topKeys = []string{"gpus", "fabric_manager", "hcas", "rdma_stacks", "kernels", "known_bad"}
	gpuKeys = []string{"model", "drivers", "cuda", "vbios", "reason", "source"}
	fmKeys  = []string{"driver", "gpu_model", "version", "reason", "source"}
	hcaKeys = []string{"model", "name", "min_firmware", "firmware", "reason", "source"}
	badKeys = []string{"when", "reason", "source"}
	// whenKeys are the fields a known-bad combination can name.
	whenKeys = []string{"driver", "cuda", "fabric_manager", "kernel", "rdma_stack", "gpu_model", "vbios", "hca_model", "hca_firmware"}
)

func (d *decoder) gpuRule(n *yaml.Node, path string) (gpuRule, error) {
	r := gpuRule{ref: ruleRef{path, n.Line}}
	kvs, err := d.mapping(n, path, gpuKeys)
	if err != nil {
		return r, err
	}
	for _, kv := range kvs {
		p := path + "." + kv.key
		switch kv.key {
		case "model":
			r.model, err = d.matcher(kv.val, p, true)
		case "drivers":
			r.drivers, err = d.specList(kv.val, p)
		case "cuda":
			r.cuda, err = d.specList(kv.val, p)
		case "vbios":
			r.vbios, err = d.specList(kv.val, p)
		case "reason":
			r.reason, err = d.scalar(kv.val, p)
		case "source":
			r.source, err = d.scalar(kv.val, p)
		}
		if err != nil {
			return r, err
		}
	}
	if r.model.text == "" {
		return r, d.errf(n, path, "missing model")
	}
	if len(r.drivers) == 0 && len(r.cuda) == 0 && len(r.vbios) == 0 {
		return r, d.errf(n, path, "empty rule: set drivers, cuda or vbios")
	}
	return r, nil
}

func (d *decoder) fmRule(n *yaml.Node, path string) (fmRule, error) {
	r := fmRule{ref: ruleRef{path, n.Line}}
	kvs, err := d.mapping(n, path, fmKeys)
	if err != nil {
		return r, err
	}
	var haveDriver, haveVersion bool
	for _, kv := range kvs {
		p := path + "." + kv.key
		switch kv.key {
		case "driver":
			haveDriver = true
			r.driver, err = d.spec(kv.val, p)
		case "gpu_model":
			var mt matcher
			mt, err = d.matcher(kv.val, p, true)
			r.gpuModel = &mt
		case "version":
			haveVersion = true
			var s string
			if s, err = d.scalar(kv.val, p); err == nil {
				if s == "same" {
					r.same = true
				} else {
					r.version, err = d.spec(kv.val, p)
				}
			}
		case "reason":
			r.reason, err = d.scalar(kv.val, p)
		case "source":
			r.source, err = d.scalar(kv.val, p)
		}
		if err != nil {
			return r, err
		}
	}
	if !haveDriver {
		return r, d.errf(n, path, `missing driver (the drivers the rule covers, "*" for all)`)
	}
	if !haveVersion {
		return r, d.errf(n, path, `missing version ("same" or a version rule)`)
	}
	return r, nil
}

func (d *decoder) hcaRule(n *yaml.Node, path string) (hcaRule, error) {
	r := hcaRule{ref: ruleRef{path, n.Line}}
	kvs, err := d.mapping(n, path, hcaKeys)
	if err != nil {
		return r, err
	}
	for _, kv := range kvs {
		p := path + "." + kv.key
		switch kv.key {
		case "model":
			r.model, err = d.matcher(kv.val, p, false)
		case "name":
			r.name, err = d.scalar(kv.val, p)
		case "min_firmware":
			var s string
			if s, err = d.scalar(kv.val, p); err == nil {
				if r.minFW, err = cleanVersion(s); err != nil {
					err = d.wrap(kv.val, p, err)
				}
			}
		case "firmware":
			r.firmware, err = d.specList(kv.val, p)
		case "reason":
			r.reason, err = d.scalar(kv.val, p)
		case "source":
			r.source, err = d.scalar(kv.val, p)
		}
		if err != nil {
			return r, err
		}
	}
	if r.model.text == "" {
		return r, d.errf(n, path, "missing model (the hca_type, e.g. MT4129)")
	}
	if r.minFW == "" && len(r.firmware) == 0 {
		return r, d.errf(n, path, "empty rule: set min_firmware or firmware")
	}
	return r, nil
}

func (d *decoder) badRule(n *yaml.Node, path string) (badRule, error) {
	r := badRule{ref: ruleRef{path, n.Line}}
	kvs, err := d.mapping(n, path, badKeys)
	if err != nil {
		return r, err
	}
	haveWhen := false
	for _, kv := range kvs {
		p := path + "." + kv.key
		switch kv.key {
		case "when":
			haveWhen = true
			r.when, err = d.badWhen(kv.val, p)
		case "reason":
			r.reason, err = d.scalar(kv.val, p)
		case "source":
			r.source, err = d.scalar(kv.val, p)
		}
		if err != nil {
			return r, err
		}
	}
	if !haveWhen {
		return r, d.errf(n, path, "missing when (the combination)")
	}
	if r.reason == "" {
		return r, d.errf(n, path, "missing reason (what goes wrong with this combination)")
	}
	return r, nil
}

func (d *decoder) badWhen(n *yaml.Node, path string) (badWhen, error) {
	var w badWhen
	kvs, err := d.mapping(n, path, whenKeys)
	if err != nil {
		return w, err
	}
	if len(kvs) == 0 {
		return w, d.errf(n, path, "empty combination (name at least one of %s)", keyList(whenKeys))
	}
	spec := func(v *yaml.Node, p string) (*spec, error) {
		s, err := d.spec(v, p)
		return &s, err
	}
	for _, kv := range kvs {
		p := path + "." + kv.key
		switch kv.key {
		case "gpu_model":
			var mt matcher
			mt, err = d.matcher(kv.val, p, true)
			w.gpuModel = &mt
		case "hca_model":
			var mt matcher
			mt, err = d.matcher(kv.val, p, false)
			w.hcaModel = &mt
		case "vbios":
			w.vbios, err = spec(kv.val, p)
		case "driver":
			w.driver, err = spec(kv.val, p)
		case "cuda":
			w.cuda, err = spec(kv.val, p)
		case "fabric_manager":
			w.fabricManager, err = spec(kv.val, p)
		case "kernel":
			w.kernel, err = spec(kv.val, p)
		case "hca_firmware":
			w.hcaFirmware, err = spec(kv.val, p)
		case "rdma_stack":
			var s string
			if s, err = d.scalar(kv.val, p); err == nil {
				var ss stackSpec
				if ss, err = parseStackSpec(s); err != nil {
					err = d.wrap(kv.val, p, err)
				}
				w.rdmaStack = &ss
			}
		}
		if err != nil {
			return w, err
		}
	}
	return w, nil
}
