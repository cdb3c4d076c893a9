// Package container tests the image's Dockerfile without Docker (CI has
// none): every path it copies from the repository exists, it builds the
// binary the Helm chart runs, and the chart's default image is this one.
package container

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

const root = "../.."

func readFile(t *testing.T, rel string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, rel))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// instructions are the Dockerfile's lines without comments, continuation
// lines joined.
func instructions(t *testing.T) []string {
	t.Helper()
	var out []string
	cur := ""
	for line := range strings.SplitSeq(readFile(t, "deploy/container/Dockerfile"), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if l, ok := strings.CutSuffix(line, "\\"); ok {
			cur += l + " "
			continue
		}
		out = append(out, cur+line)
		cur = ""
	}
	return out
}

func TestDockerfilePathsExist(t *testing.T) {
	t.Parallel()
	var froms, copies int
	built := false
	for _, ins := range instructions(t) {
		f := strings.Fields(ins)
		switch strings.ToUpper(f[0]) {
		case "FROM":
			froms++
		case "COPY":
			if strings.HasPrefix(f[1], "--from=") {
				continue
			}
			for _, src := range f[1 : len(f)-1] {
				copies++
				if src == "." {
					continue
				}
				if _, err := os.Stat(filepath.Join(root, src)); err != nil {
					t.Errorf("COPY %s: %v", src, err)
				}
			}
		case "RUN":
			if m := regexp.MustCompile(`go build .*-o (\S+) (\./\S+)`).FindStringSubmatch(ins); m != nil {
				built = true
				if filepath.Base(m[1]) != "fleetcheck" {
					t.Errorf("builds %s; the chart runs the command fleetcheck", m[1])
				}
				if _, err := os.Stat(filepath.Join(root, m[2], "main.go")); err != nil {
					t.Errorf("go build %s: %v", m[2], err)
				}
				if strings.Contains(ins, "-tags") {
					t.Error("the image needs the full build (the coordinator): no build tags")
				}
			}
		case "USER":
			t.Errorf("%s: the chart sets each pod's user; an image USER would run the agent unprivileged", ins)
		}
	}
	if froms != 2 || copies == 0 || !built {
		t.Errorf("%d FROM, %d COPY sources, go build found %v: want a two-stage build of ./cmd/fleetcheck", froms, copies, built)
	}
	// The binary lands on PATH as the chart's command names it.
	if !strings.Contains(strings.Join(instructions(t), "\n"), "COPY --from=build /out/fleetcheck /usr/bin/fleetcheck") {
		t.Error("the binary is not copied to /usr/bin/fleetcheck")
	}
}

// TestBuilderMatchesGoMod: the builder's Go is the go.mod's.
func TestBuilderMatchesGoMod(t *testing.T) {
	t.Parallel()
	m := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindStringSubmatch(readFile(t, "go.mod"))
	if m == nil {
		t.Fatal("go.mod has no go line")
	}
	if !strings.Contains(readFile(t, "deploy/container/Dockerfile"), "FROM golang:"+m[1]+"-") {
		t.Errorf("the builder is not golang:%s (go.mod's)", m[1])
	}
}

// TestChartRunsThisImage: the chart's default image is the one the
// Dockerfile's header says it builds, and its command is the binary.
func TestChartRunsThisImage(t *testing.T) {
	t.Parallel()
	var values struct {
		Image struct {
			Repository string `yaml:"repository"`
			Tag        string `yaml:"tag"`
		} `yaml:"image"`
	}
	if err := yaml.Unmarshal([]byte(readFile(t, "deploy/helm/fleetcheck/values.yaml")), &values); err != nil {
		t.Fatal(err)
	}
	var chart struct {
		AppVersion string `yaml:"appVersion"`
	}
	if err := yaml.Unmarshal([]byte(readFile(t, "deploy/helm/fleetcheck/Chart.yaml")), &chart); err != nil {
		t.Fatal(err)
	}
	tag := values.Image.Tag
	if tag == "" {
		tag = chart.AppVersion
	}
	want := values.Image.Repository + ":" + tag
	if df := readFile(t, "deploy/container/Dockerfile"); !strings.Contains(df, "-t "+want+" ") {
		t.Errorf("the Dockerfile's build command does not tag %s, the chart's default image", want)
	}
	for _, tpl := range []string{"agent-daemonset.yaml", "coordinator-statefulset.yaml"} {
		s := readFile(t, "deploy/helm/fleetcheck/templates/"+tpl)
		if !strings.Contains(s, `include "fleetcheck.image" .`) || !strings.Contains(s, `command: ["fleetcheck", `) {
			t.Errorf("%s does not run fleetcheck from the chart's image", tpl)
		}
	}
	if !strings.Contains(readFile(t, "docs/deploy.md"), "deploy/container/Dockerfile") {
		t.Error("docs/deploy.md does not say how to build the image")
	}
}
