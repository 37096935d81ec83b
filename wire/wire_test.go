package wire

import (
	"bytes"
	"encoding/hex"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

var update = flag.Bool("update", false, "rewrite protocol/vectors.json and protocol/constants.json")

func TestVectorFiles(t *testing.T) {
	files := map[string][]byte{
		"vectors.json":   MarshalIndent(Vectors()),
		"constants.json": MarshalIndent(Constants()),
	}
	for name, want := range files {
		path := filepath.Join("..", "protocol", name)
		if *update {
			if err := os.WriteFile(path, want, 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		got, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s differs from what wire generates; run (cd wire && go test -run TestVectorFiles -update)", path)
		}
	}
}

func mustHex(t *testing.T, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func mustU64(t *testing.T, s string) uint64 {
	t.Helper()
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestVectorsDecode decodes every committed vector from its bytes and compares the fields, the
// way every other client does.
func TestVectorsDecode(t *testing.T) {
	f := Vectors()
	for _, v := range f.Requests {
		b := mustHex(t, v.Hex)
		var r Request
		n, err := DecodeRequest(b, MaxKeyLen, &r)
		if err != nil || n != len(b) {
			t.Fatalf("%s: n=%d err=%v", v.Name, n, err)
		}
		if r.Op.String() != v.Fields.Op || r.ID != mustU64(t, v.Fields.ID) || r.Token != mustU64(t, v.Fields.Token) ||
			r.Lease != v.Fields.Lease || r.WaitMs != v.Fields.WaitMs || hex.EncodeToString(r.Key) != v.Fields.KeyHex {
			t.Errorf("%s: decoded %+v", v.Name, r)
		}
		if got := AppendRequest(nil, &r); !bytes.Equal(got, b) {
			t.Errorf("%s: re-encode differs", v.Name)
		}
	}
	for _, v := range f.Responses {
		b := mustHex(t, v.Hex)
		var r Response
		n, err := DecodeResponse(b, MaxDataLen, &r)
		if err != nil || n != len(b) {
			t.Fatalf("%s: n=%d err=%v", v.Name, n, err)
		}
		if r.Op.String() != v.Fields.Op || r.Status.String() != v.Fields.Status || r.ID != mustU64(t, v.Fields.ID) ||
			r.Token != mustU64(t, v.Fields.Token) || r.Lease != v.Fields.Lease || r.Detail != v.Fields.Detail ||
			hex.EncodeToString(r.Data) != v.Fields.DataHex {
			t.Errorf("%s: decoded %+v", v.Name, r)
		}
	}
	for _, v := range f.Malformed {
		b := mustHex(t, v.Hex)
		var err error
		if v.Kind == "request" {
			_, err = DecodeRequest(b, v.MaxVar, &Request{})
		} else {
			_, err = DecodeResponse(b, v.MaxVar, &Response{})
		}
		want := map[string]error{"short": ErrShort, "length": ErrLength, "too_large": ErrTooLarge}[v.Error]
		if !errors.Is(err, want) {
			t.Errorf("%s: err=%v want %v", v.Name, err, want)
		}
	}
}

func TestHandshakeVectors(t *testing.T) {
	f := Vectors()
	for _, a := range f.Auth {
		var sid [SessionIDSize]byte
		var cn, sn [NonceSize]byte
		w := Welcome{Status: StatusOK, Flags: a.WelcomeFlags, GraceMs: a.GraceMs}
		copy(sid[:], mustHex(t, a.SessionID))
		copy(cn[:], mustHex(t, a.ClientNonce))
		copy(sn[:], mustHex(t, a.ServerNonce))
		copy(w.StateID[:], mustHex(t, a.StateID))
		cp := ClientProof([]byte(a.Token), &sid, &cn, &sn)
		sp := ServerProof([]byte(a.Token), &sid, &cn, &sn, &w)
		if hex.EncodeToString(cp[:]) != a.ClientProof || hex.EncodeToString(sp[:]) != a.ServerProof {
			t.Fatalf("%s: proofs differ from vectors", a.Name)
		}
		if cp == sp {
			t.Fatal("client and server proofs must differ")
		}
		// The proof covers the state id and the resumed flag.
		w2 := w
		w2.StateID[0] ^= 1
		if ServerProof([]byte(a.Token), &sid, &cn, &sn, &w2) == sp {
			t.Fatal("server proof does not cover the state id")
		}
		w2 = w
		w2.Flags ^= WelcomeResumed
		if ServerProof([]byte(a.Token), &sid, &cn, &sn, &w2) == sp {
			t.Fatal("server proof does not cover the resumed flag")
		}
	}
	if f.Auth[0].ServerProof == f.Auth[1].ServerProof {
		t.Fatal("new-session and resumed proofs must differ")
	}
	for _, v := range f.Handshake {
		b := mustHex(t, v.Hex)
		switch v.Op {
		case "HELLO":
			var h Hello
			if err := DecodeHello(b, &h); err != nil || h.Version != v.Version || hex.EncodeToString(h.SessionID[:]) != v.SessionID ||
				hex.EncodeToString(h.Nonce[:]) != v.Nonce {
				t.Errorf("%s: %v %+v", v.Name, err, h)
			}
		case "CHALLENGE":
			var c Challenge
			if err := DecodeChallenge(b, &c); err != nil || c.Status.String() != v.Status || c.Version != v.Version ||
				uint16(c.Flags) != v.Flags || c.Detail != v.Detail || hex.EncodeToString(c.Nonce[:]) != v.Nonce ||
				hex.EncodeToString(c.Data) != v.DataHex {
				t.Errorf("%s: %v %+v", v.Name, err, c)
			}
			if got := AppendChallenge(nil, &c); !bytes.Equal(got, b) {
				t.Errorf("%s: re-encode differs", v.Name)
			}
		case "AUTH":
			var x Auth
			if err := DecodeAuth(b, &x); err != nil || hex.EncodeToString(x.Proof[:]) != v.Proof {
				t.Errorf("%s: %v", v.Name, err)
			}
		case "WELCOME":
			var w Welcome
			if err := DecodeWelcome(b, &w); err != nil || w.Status.String() != v.Status || uint16(w.Flags) != v.Flags ||
				w.Detail != v.Detail || w.GraceMs != v.GraceMs || hex.EncodeToString(w.StateID[:]) != v.StateID ||
				hex.EncodeToString(w.Proof[:]) != v.Proof {
				t.Errorf("%s: %v %+v", v.Name, err, w)
			}
			if got := AppendWelcome(nil, &w); !bytes.Equal(got, b) {
				t.Errorf("%s: re-encode differs", v.Name)
			}
		default:
			t.Errorf("%s: unknown op %s", v.Name, v.Op)
		}
	}
}

func TestHandshakeRejects(t *testing.T) {
	h := AppendHello(nil, &Hello{Version: 1})
	if err := DecodeHello(h[:len(h)-1], &Hello{}); err == nil {
		t.Error("truncated hello accepted")
	}
	if err := DecodeAuth(h, &Auth{}); !errors.Is(err, ErrLength) {
		t.Errorf("hello as auth: %v", err)
	}
	a := AppendAuth(nil, &Auth{})
	a[4] = byte(OpWelcome)
	if err := DecodeAuth(a, &Auth{}); !errors.Is(err, ErrWrongOp) {
		t.Errorf("wrong op: %v", err)
	}
}

func TestSplitFrames(t *testing.T) {
	// Several frames back to back, fed one byte at a time: the decoder asks for more until each is whole.
	var stream []byte
	for i := 1; i <= 3; i++ {
		stream = AppendRequest(stream, &Request{Op: OpAcquire, ID: uint64(i), Lease: 1000, Key: bytes.Repeat([]byte{'k'}, i*7)})
	}
	var got []uint64
	buf := []byte{}
	for _, c := range stream {
		buf = append(buf, c)
		var r Request
		n, err := DecodeRequest(buf, 256, &r)
		if errors.Is(err, ErrShort) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, r.ID)
		buf = buf[n:]
	}
	if len(got) != 3 || got[0] != 1 || got[2] != 3 || len(buf) != 0 {
		t.Fatalf("got %v rest %d", got, len(buf))
	}
}

func TestOversizeKeyDetectedFromHeader(t *testing.T) {
	b := AppendRequest(nil, &Request{Op: OpAcquire, ID: 1, Lease: 1, Key: make([]byte, 300)})
	if _, err := DecodeRequest(b[:8], 256, &Request{}); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("want ErrTooLarge from the length field alone, got %v", err)
	}
}

func TestZeroAlloc(t *testing.T) {
	buf := make([]byte, 0, 256)
	key := []byte("order-1234")
	var r Request
	var resp Response
	allocs := testing.AllocsPerRun(1000, func() {
		b := AppendRequest(buf[:0], &Request{Op: OpAcquire, ID: 9, Lease: 1, Key: key})
		if _, err := DecodeRequest(b, 256, &r); err != nil {
			t.Fatal(err)
		}
		b = AppendResponseString(buf[:0], OpAcquire, StatusInvalid, 9, 0, 0, FieldKey, "key too long")
		if _, err := DecodeResponse(b, 256, &resp); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Fatalf("allocs = %v, want 0", allocs)
	}
}

func BenchmarkDecodeRequest(b *testing.B) {
	f := AppendRequest(nil, &Request{Op: OpAcquire, ID: 9, Lease: 1, Key: []byte("order-1234")})
	var r Request
	b.ReportAllocs()
	for b.Loop() {
		if _, err := DecodeRequest(f, 256, &r); err != nil {
			b.Fatal(err)
		}
	}
}
