package ticketing

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"os"
	"testing"

	"github.com/ticketing/ticketing/wire"
)

// Fuzz targets for what the client reads from a server: whatever the bytes, the reader and the
// handshake return an error or a result, never panic, and never read past what they were given.
// `go test` runs them on their seeds (every response and handshake vector); `go test -fuzz`
// explores further.

func vectorSeeds(f *testing.F, list string) [][]byte {
	b, err := os.ReadFile(protocolFile("vectors.json"))
	if err != nil {
		f.Fatal(err)
	}
	var v map[string]json.RawMessage
	if err := json.Unmarshal(b, &v); err != nil {
		f.Fatal(err)
	}
	var entries []struct {
		Hex string `json:"hex"`
	}
	if err := json.Unmarshal(v[list], &entries); err != nil {
		f.Fatal(err)
	}
	var out [][]byte
	for _, e := range entries {
		h, err := hex.DecodeString(e.Hex)
		if err != nil {
			f.Fatal(err)
		}
		out = append(out, h)
	}
	return out
}

func FuzzReadResponse(f *testing.F) {
	for _, s := range vectorSeeds(f, "responses") {
		f.Add(s, 256)
	}
	for _, s := range vectorSeeds(f, "malformed") {
		f.Add(s, 256)
	}
	f.Fuzz(func(t *testing.T, b []byte, maxData int) {
		maxData = max(0, min(maxData, wire.MaxDataLen))
		br := bufio.NewReader(bytes.NewReader(b))
		var buf []byte
		for range 64 {
			var r wire.Response
			var err error
			buf, err = readResponse(br, buf, maxData, &r)
			if err != nil {
				if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, ErrProtocol) {
					t.Fatalf("unexpected error %v", err)
				}
				return
			}
			if len(r.Data) > maxData {
				t.Fatalf("data of %d bytes above the limit %d", len(r.Data), maxData)
			}
		}
	})
}

// FuzzHandshake feeds arbitrary server bytes to the client's handshake (with a token, so that
// the proof check runs too).
func FuzzHandshake(f *testing.F) {
	hs := vectorSeeds(f, "handshake")
	for _, a := range hs {
		for _, b := range hs {
			f.Add(append(append([]byte(nil), a...), b...))
		}
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var session [16]byte
		var nonce [32]byte
		session[0] = 1
		rw := struct {
			io.Reader
			io.Writer
		}{bytes.NewReader(b), io.Discard}
		w, err := handshake(rw, &session, &nonce, []byte("token"), true)
		if err == nil && w == nil {
			t.Fatal("no WELCOME and no error")
		}
	})
}
