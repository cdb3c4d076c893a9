package coordinator

import (
	"fmt"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/fleetcheck/fleetcheck/internal/drain"
	k8sdrain "github.com/fleetcheck/fleetcheck/internal/drain/kubernetes"
	"github.com/fleetcheck/fleetcheck/internal/drain/slurm"
)

// DrainConfig picks how campaigns take nodes out of service.
//
//	drain:
//	  adapter: slurm            # none (default) | slurm | kubernetes
//	  slurm: {scontrol: /usr/bin/scontrol, timeout: 30s}
//	  kubernetes: {kubeconfig: /etc/fleetcheck/kubeconfig, evict_unmanaged: false}
//	  policy: {actions: [drain, replace, reseat], codes: [ECC_UNCORRECTABLE]}
type DrainConfig struct {
	Adapter    string           `yaml:"adapter"`
	Slurm      SlurmDrainConfig `yaml:"slurm"`
	Kubernetes K8sDrainConfig   `yaml:"kubernetes"`
	// Policy takes nodes out of service as their results arrive
	// (drainpolicy.go); off by default.
	Policy DrainPolicyConfig `yaml:"policy"`
}

// SlurmDrainConfig names the Slurm tools (PATH lookups by default).
type SlurmDrainConfig struct {
	Scontrol string        `yaml:"scontrol"`
	Sinfo    string        `yaml:"sinfo"`
	Squeue   string        `yaml:"squeue"`
	Timeout  time.Duration `yaml:"timeout"`
	Env      []string      `yaml:"env"`
}

// K8sDrainConfig reaches the API server: Kubeconfig, or in-cluster
// credentials when empty.
type K8sDrainConfig struct {
	Kubeconfig      string        `yaml:"kubeconfig"`
	EvictionTimeout time.Duration `yaml:"eviction_timeout"`
	EvictUnmanaged  bool          `yaml:"evict_unmanaged"`
}

// newDrainAdapter builds the configured adapter.
func newDrainAdapter(c DrainConfig) (drain.Adapter, error) {
	switch c.Adapter {
	case "", "none":
		return drain.NewNone(nil), nil
	case "slurm":
		return slurm.New(slurm.Options{Scontrol: c.Slurm.Scontrol, Sinfo: c.Slurm.Sinfo, Squeue: c.Slurm.Squeue,
			Timeout: c.Slurm.Timeout, Env: c.Slurm.Env}), nil
	case "kubernetes":
		rules := clientcmd.NewDefaultClientConfigLoadingRules()
		rules.ExplicitPath = c.Kubernetes.Kubeconfig
		rc, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
		if err != nil {
			return nil, fmt.Errorf("drain kubernetes: %w", err)
		}
		cs, err := kubernetes.NewForConfig(rc)
		if err != nil {
			return nil, fmt.Errorf("drain kubernetes: %w", err)
		}
		return k8sdrain.New(cs, k8sdrain.Options{EvictionTimeout: c.Kubernetes.EvictionTimeout,
			EvictUnmanaged: c.Kubernetes.EvictUnmanaged}), nil
	}
	return nil, fmt.Errorf("drain adapter %q: unknown", c.Adapter)
}
