package authz

import (
	"testing"

	"github.com/fleetcheck/fleetcheck/internal/pki"
	pb "github.com/fleetcheck/fleetcheck/proto/fleetcheck/v1"
)

// CampaignService drives drains and upgrades: operators only, like
// OperatorService.
func TestCampaignServiceAdminOnly(t *testing.T) {
	t.Parallel()
	a, err := New(Config{TrustDomain: "fleet.test"})
	if err != nil {
		t.Fatal(err)
	}
	m := "/" + pb.CampaignService_ServiceDesc.ServiceName + "/SweepStart"
	if !a.allowed(pki.KindAdmin, m) {
		t.Errorf("admin refused %s", m)
	}
	if a.allowed(pki.KindNode, m) {
		t.Errorf("node allowed %s", m)
	}
}

// RemediationService drains nodes and opens RMAs: operators only.
func TestRemediationServiceAdminOnly(t *testing.T) {
	t.Parallel()
	a, err := New(Config{TrustDomain: "fleet.test"})
	if err != nil {
		t.Fatal(err)
	}
	for _, rpc := range []string{"RemediationList", "RemediationShow", "RemediationApprove", "RemediationCancel"} {
		m := "/" + pb.RemediationService_ServiceDesc.ServiceName + "/" + rpc
		if !a.allowed(pki.KindAdmin, m) {
			t.Errorf("admin refused %s", m)
		}
		if a.allowed(pki.KindNode, m) {
			t.Errorf("node allowed %s", m)
		}
	}
}
