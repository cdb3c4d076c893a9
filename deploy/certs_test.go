package deploy

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fakeIssuer is a `fleetcheck` that writes what `certs issue node NAME
// --dir CA --out DIR` writes (KIND-NAME.crt/.key and ca.crt), the CA's
// name in each file, and refuses the node "refused".
const fakeIssuer = `
[ "$1 $2 $3" = "certs issue node" ] || exit 9
name=$4; shift 4
ca= out=
while [ $# -gt 0 ]; do
	case $1 in
	--dir) ca=$2; shift ;;
	--out) out=$2; shift ;;
	esac
	shift
done
[ "$name" = refused ] && { echo "refused" >&2; exit 1; }
printf 'cert %s by %s\n' "$name" "$ca" >"$out/node-$name.crt"
printf 'key %s\n' "$name" >"$out/node-$name.key"
cat "$ca/ca.crt" >"$out/ca.crt"
`

func TestNodeCertsScript(t *testing.T) {
	t.Parallel()
	r := newFakeRoot(t)
	r.script("fleetcheck", fakeIssuer)
	ca := filepath.Join(r.dir, "ca")
	if err := os.Mkdir(ca, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ca, "ca.crt"), []byte("OLD CA\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	nodes := filepath.Join(r.dir, "nodes.txt")
	if err := os.WriteFile(nodes, []byte("gpu-001\n# spares\n\n  gpu-002  \nrefused\n../etc\ngpu-003"), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(r.dir, "out")
	script, err := filepath.Abs("certs/fleetcheck-node-certs")
	if err != nil {
		t.Fatal(err)
	}
	// The script reads the node list on stdin.
	feed := filepath.Join(r.dir, "feed")
	if err := os.WriteFile(feed, []byte(`exec "$FAKE_SH" "`+script+`" "$@" <"`+nodes+`"`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r.env = []string{"FAKE_SH=" + posixShell()}
	run := func(args ...string) (string, int) { return r.run(feed, args...) }
	read := func(p string) string {
		b, err := os.ReadFile(filepath.Join(out, p))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}

	msg, code := run(ca, out)
	if code != 1 || !strings.Contains(msg, "refused: not issued") || !strings.Contains(msg, "../etc: not a node name") ||
		!strings.Contains(msg, "3 issued, 2 failed") {
		t.Fatalf("exit %d, want 1 with both failures named:\n%s", code, msg)
	}
	for _, n := range []string{"gpu-001", "gpu-002", "gpu-003"} {
		if got := read(n + "/node.crt"); got != "cert "+n+" by "+ca+"\n" {
			t.Errorf("%s/node.crt = %q", n, got)
		}
		if got := read(n + "/node.key"); got != "key "+n+"\n" {
			t.Errorf("%s/node.key = %q", n, got)
		}
		if got := read(n + "/ca.crt"); got != "OLD CA\n" {
			t.Errorf("%s/ca.crt = %q, want the CA's", n, got)
		}
		ents, err := os.ReadDir(filepath.Join(out, n))
		if err != nil || len(ents) != 3 {
			t.Errorf("%s holds %v (%v), want node.crt, node.key and ca.crt only", n, ents, err)
		}
	}
	for _, bad := range []string{"refused", "etc", "# spares"} {
		if _, err := os.Stat(filepath.Join(out, bad)); err == nil {
			t.Errorf("%s: a directory was left for a node not issued", bad)
		}
	}
	if _, err := os.Stat(filepath.Join(r.dir, "etc")); err == nil {
		t.Error("../etc escaped the output directory")
	}

	// Rotation: a bundle of old and new CA becomes every ca.crt, and the
	// run replaces what is there.
	bundle := filepath.Join(r.dir, "bundle.crt")
	if err := os.WriteFile(bundle, []byte("OLD CA\nNEW CA\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(ca, "ca.crt"), []byte("NEW CA\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if msg, code := run(ca, out, bundle); code != 1 || !strings.Contains(msg, "3 issued") {
		t.Fatalf("with a bundle: exit %d:\n%s", code, msg)
	}
	if got := read("gpu-002/ca.crt"); got != "OLD CA\nNEW CA\n" {
		t.Errorf("ca.crt with a bundle = %q, want the bundle", got)
	}

	for _, bad := range [][]string{{ca}, {filepath.Join(r.dir, "nope"), out}, {ca, out, filepath.Join(r.dir, "nope.crt")}} {
		if msg, code := run(bad...); code != 2 {
			t.Errorf("%v: exit %d, want 2 (bad usage):\n%s", bad, code, msg)
		}
	}
}
