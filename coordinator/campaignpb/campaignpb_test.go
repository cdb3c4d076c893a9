package campaignpb

import (
	"encoding/json"
	"fmt"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/fleetcheck/fleetcheck/baselines"
	"github.com/fleetcheck/fleetcheck/campaigns/burnin"
	"github.com/fleetcheck/fleetcheck/campaigns/drill"
	"github.com/fleetcheck/fleetcheck/campaigns/rollout"
	"github.com/fleetcheck/fleetcheck/campaigns/sweep"
	pb "github.com/fleetcheck/fleetcheck/proto/fleetcheck/v1"
)

// fill sets every exported field of *p, nested ones too, to a value of its
// own (n counts up), so a field an engine adds that the conversion drops
// shows as a difference. Spec fields are left alone: the caller sets a
// real one.
func fill(v reflect.Value, n *int) {
	*n++
	switch v.Kind() {
	case reflect.String:
		v.SetString(fmt.Sprintf("s%d", *n))
	case reflect.Int, reflect.Int32, reflect.Int64:
		if v.Type() == reflect.TypeFor[time.Duration]() || strings.HasSuffix(v.Type().Name(), "Duration") {
			v.SetInt(int64(*n) * int64(time.Second))
			return
		}
		v.SetInt(int64(*n))
	case reflect.Float64:
		v.SetFloat(float64(*n) + 0.25)
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Pointer:
		v.Set(reflect.New(v.Type().Elem()))
		fill(v.Elem(), n)
	case reflect.Slice:
		s := reflect.MakeSlice(v.Type(), 2, 2)
		for i := range 2 {
			fill(s.Index(i), n)
		}
		v.Set(s)
	case reflect.Map:
		m := reflect.MakeMap(v.Type())
		for range 2 {
			k, e := reflect.New(v.Type().Key()).Elem(), reflect.New(v.Type().Elem()).Elem()
			fill(k, n)
			fill(e, n)
			m.SetMapIndex(k, e)
		}
		v.Set(m)
	case reflect.Struct:
		if v.Type() == reflect.TypeFor[time.Time]() {
			v.Set(reflect.ValueOf(time.Date(2026, 3, 2, 2, 0, *n, 123456789+*n, time.UTC)))
			return
		}
		for i := range v.NumField() {
			f := v.Type().Field(i)
			if !f.IsExported() || f.Name == "Spec" {
				continue
			}
			fill(v.Field(i), n)
		}
	default:
		panic("fill: " + v.Type().String())
	}
}

func filled[T any]() T {
	var v T
	n := 0
	fill(reflect.ValueOf(&v).Elem(), &n)
	return v
}

// overWire sends m through proto's encoding, as gRPC does.
func overWire[M proto.Message](t *testing.T, m M) M {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	out := m.ProtoReflect().New().Interface().(M)
	if err := proto.Unmarshal(b, out); err != nil {
		t.Fatal(err)
	}
	return out
}

// sameJSON fails unless got prints as want does: the CLI prints what the
// conversion gives back, so that is the contract.
func sameJSON(t *testing.T, what string, want, got any) {
	t.Helper()
	w, err := json.MarshalIndent(want, "", " ")
	if err != nil {
		t.Fatal(err)
	}
	g, err := json.MarshalIndent(got, "", " ")
	if err != nil {
		t.Fatal(err)
	}
	if string(w) != string(g) {
		t.Errorf("%s: the round trip changed the JSON\n--- want\n%s\n--- got\n%s", what, w, g)
	}
}

func spec[T any](t *testing.T, file string, parse func([]byte) (*T, error)) *T {
	t.Helper()
	b, err := os.ReadFile("../../examples/" + file)
	if err != nil {
		t.Fatal(err)
	}
	s, err := parse(b)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func must[T any](t *testing.T) func(T, error) T {
	return func(v T, err error) T {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
}

func TestRoundTripKeepsEveryField(t *testing.T) {
	t.Parallel()
	t.Run("baselines", func(t *testing.T) {
		l := filled[[]baselines.Baseline]()
		sameJSON(t, "list", l, BaselineListFrom(overWire(t, BaselineListPB(l))))
		r := filled[baselines.RecordReport]()
		sameJSON(t, "record", r, BaselineRecordFrom(overWire(t, BaselineRecordPB(r))))
		i := filled[baselines.ImportResult]()
		sameJSON(t, "import", i, BaselineImportFrom(overWire(t, BaselineImportPB(i))))
	})
	t.Run("sweep", func(t *testing.T) {
		p := filled[sweep.Progress]()
		sameJSON(t, "status", p, SweepStatusFrom(overWire(t, SweepStatusPB(p))))
		l := filled[[]sweep.Summary]()
		sameJSON(t, "list", l, SweepListFrom(overWire(t, SweepListPB(l))))
	})
	t.Run("rollout", func(t *testing.T) {
		s := filled[rollout.Status]()
		s.Spec = spec(t, "rollout.yaml", rollout.ParseSpec)
		sameJSON(t, "status", s, must[rollout.Status](t)(RolloutStatusFrom(overWire(t, must[*pbRolloutStatus](t)(RolloutStatusPB(&s))))))
		l := filled[[]rollout.Summary]()
		sameJSON(t, "list", l, RolloutListFrom(overWire(t, RolloutListPB(l))))
		p := filled[rollout.PlanResult]()
		p.Spec = s.Spec
		sameJSON(t, "plan", p, must[rollout.PlanResult](t)(RolloutPlanFrom(overWire(t, must[*pbRolloutPlan](t)(RolloutPlanPB(&p))))))
	})
	t.Run("burnin", func(t *testing.T) {
		l := filled[[]burnin.CampaignStatus]()
		sameJSON(t, "list", l, BurninListFrom(overWire(t, BurninListPB(l))))
	})
	t.Run("drill", func(t *testing.T) {
		l := filled[[]drill.Drill]()
		for i := range l {
			l[i].Spec = spec(t, "drill.yaml", drill.ParseSpec)
		}
		sameJSON(t, "list", l, must[[]drill.Drill](t)(DrillListFrom(overWire(t, must[*pbDrillList](t)(DrillListPB(l))))))
	})
}

// An engine's empty or absent list travels as nothing and comes back as
// [] (docs/deploy.md, upgrading): never null, so a script can range over it.
func TestEmptyListsComeBackEmpty(t *testing.T) {
	t.Parallel()
	s := rollout.Status{Spec: spec(t, "rollout.yaml", rollout.ParseSpec)}
	got, err := RolloutStatusFrom(overWire(t, must[*pbRolloutStatus](t)(RolloutStatusPB(&s))))
	if err != nil {
		t.Fatal(err)
	}
	b, err := json.Marshal(got)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), "null") {
		t.Errorf("null in %s", b)
	}
	for _, f := range []string{`"waves":[]`, `"nodes":[]`, `"excluded":[]`, `"counts":{}`} {
		if !strings.Contains(string(b), f) {
			t.Errorf("no %s in %s", f, b)
		}
	}
}

type (
	pbRolloutStatus = pb.RolloutStatusReply
	pbRolloutPlan   = pb.RolloutPlanReply
	pbDrillList     = pb.DrillListReply
)
