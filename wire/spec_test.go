package wire

import (
	"bytes"
	"encoding/hex"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestProtocolHexDumps checks every hex dump in PROTOCOL.md against the vector it names, and that
// every vector has a dump, so the spec and vectors.json cannot drift apart.
func TestProtocolHexDumps(t *testing.T) {
	spec, err := os.ReadFile(filepath.Join("..", "PROTOCOL.md"))
	if err != nil {
		t.Fatal(err)
	}
	f := Vectors()
	want := map[string]string{}
	for _, v := range f.Requests {
		want["requests/"+v.Name] = v.Hex
	}
	for _, v := range f.Responses {
		want["responses/"+v.Name] = v.Hex
	}
	for _, v := range f.Handshake {
		want["handshake/"+v.Name] = v.Hex
	}
	re := regexp.MustCompile("(?s)<!-- vector ([a-z]+/[a-z0-9_]+) -->\n```\n(.*?)```")
	seen := map[string]bool{}
	for _, m := range re.FindAllStringSubmatch(string(spec), -1) {
		name, dump := m[1], m[2]
		var got []byte
		for _, line := range strings.Split(strings.TrimSpace(dump), "\n") {
			fields := strings.Fields(line)
			for _, h := range fields[1:] {
				b, err := hex.DecodeString(h)
				if err != nil {
					t.Fatalf("%s: bad hex %q", name, h)
				}
				got = append(got, b...)
			}
		}
		w, ok := want[name]
		if !ok {
			t.Errorf("PROTOCOL.md dumps %s, which vectors.json does not have", name)
			continue
		}
		if wb, _ := hex.DecodeString(w); !bytes.Equal(got, wb) {
			t.Errorf("PROTOCOL.md dump of %s differs from vectors.json", name)
		}
		seen[name] = true
	}
	for name := range want {
		if !seen[name] {
			t.Errorf("vector %s has no hex dump in PROTOCOL.md", name)
		}
	}
	for _, a := range f.Auth {
		if !strings.Contains(string(spec), a.ServerProof) || !strings.Contains(string(spec), a.ClientProof) {
			t.Errorf("PROTOCOL.md does not show the proofs of auth vector %s", a.Name)
		}
	}
}
