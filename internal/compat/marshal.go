package compat

import "gopkg.in/yaml.v3"

// The file* types write a matrix back out in its own format, so a config
// holding an inline matrix survives a YAML round trip.
type fileMatrix struct {
	GPUs          []fileGPU `yaml:"gpus,omitempty"`
	FabricManager []fileFM  `yaml:"fabric_manager,omitempty"`
	HCAs          []fileHCA `yaml:"hcas,omitempty"`
	RDMAStacks    []string  `yaml:"rdma_stacks,omitempty"`
	Kernels       []string  `yaml:"kernels,omitempty"`
	KnownBad      []fileBad `yaml:"known_bad,omitempty"`
}

type fileGPU struct {
	Model   string   `yaml:"model"`
	Drivers []string `yaml:"drivers,omitempty"`
	CUDA    []string `yaml:"cuda,omitempty"`
	VBIOS   []string `yaml:"vbios,omitempty"`
	Reason  string   `yaml:"reason,omitempty"`
	Source  string   `yaml:"source,omitempty"`
}

type fileFM struct {
	Driver   string `yaml:"driver"`
	GPUModel string `yaml:"gpu_model,omitempty"`
	Version  string `yaml:"version"`
	Reason   string `yaml:"reason,omitempty"`
	Source   string `yaml:"source,omitempty"`
}

type fileHCA struct {
	Model       string   `yaml:"model"`
	Name        string   `yaml:"name,omitempty"`
	MinFirmware string   `yaml:"min_firmware,omitempty"`
	Firmware    []string `yaml:"firmware,omitempty"`
	Reason      string   `yaml:"reason,omitempty"`
	Source      string   `yaml:"source,omitempty"`
}

type fileBad struct {
	When   yaml.Node `yaml:"when"`
	Reason string    `yaml:"reason"`
	Source string    `yaml:"source,omitempty"`
}

// MarshalYAML writes the matrix in the format Parse reads.
func (m *Matrix) MarshalYAML() (any, error) {
	var f fileMatrix
	if m == nil {
		return f, nil
	}
	for _, r := range m.gpus {
		f.GPUs = append(f.GPUs, fileGPU{
			Model: r.model.text, Drivers: r.drivers.texts(), CUDA: r.cuda.texts(), VBIOS: r.vbios.texts(),
			Reason: r.reason, Source: r.source,
		})
	}
	for _, r := range m.fabric {
		e := fileFM{Driver: r.driver.text, Version: r.version.text, Reason: r.reason, Source: r.source}
		if r.same {
			e.Version = "same"
		}
		if r.gpuModel != nil {
			e.GPUModel = r.gpuModel.text
		}
		f.FabricManager = append(f.FabricManager, e)
	}
	for _, r := range m.hcas {
		f.HCAs = append(f.HCAs, fileHCA{
			Model: r.model.text, Name: r.name, MinFirmware: r.minFW, Firmware: r.firmware.texts(),
			Reason: r.reason, Source: r.source,
		})
	}
	for _, s := range m.rdma {
		f.RDMAStacks = append(f.RDMAStacks, s.text)
	}
	f.Kernels = m.kernels.texts()
	for _, r := range m.knownBad {
		when := yaml.Node{Kind: yaml.MappingNode}
		for _, k := range r.when.names() {
			when.Content = append(when.Content,
				&yaml.Node{Kind: yaml.ScalarNode, Value: k},
				&yaml.Node{Kind: yaml.ScalarNode, Value: r.when.value(k), Style: yaml.DoubleQuotedStyle})
		}
		f.KnownBad = append(f.KnownBad, fileBad{When: when, Reason: r.reason, Source: r.source})
	}
	return f, nil
}

var _ yaml.Marshaler = (*Matrix)(nil)
