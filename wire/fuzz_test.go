package wire

import (
	"bytes"
	"encoding/hex"
	"errors"
	"testing"
)

// FuzzDecodeRequest: any byte string either decodes to a request that re-encodes to the same
// bytes, or fails with one of the documented errors. Never a panic, never an over-read.
func FuzzDecodeRequest(f *testing.F) {
	for _, v := range Vectors().Requests {
		b, _ := hex.DecodeString(v.Hex)
		f.Add(b)
	}
	for _, v := range Vectors().Malformed {
		b, _ := hex.DecodeString(v.Hex)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var r Request
		n, err := DecodeRequest(b, 512, &r)
		if err != nil {
			if !errors.Is(err, ErrShort) && !errors.Is(err, ErrLength) && !errors.Is(err, ErrTooLarge) {
				t.Fatalf("undocumented error %v", err)
			}
			return
		}
		if n < HeaderSize || n > len(b) || len(r.Key) > 512 {
			t.Fatalf("n=%d len=%d key=%d", n, len(b), len(r.Key))
		}
		if got := AppendRequest(nil, &r); !bytes.Equal(got, b[:n]) {
			t.Fatalf("round trip differs")
		}
	})
}

// FuzzDecodeResponse mirrors FuzzDecodeRequest for the client side.
func FuzzDecodeResponse(f *testing.F) {
	for _, v := range Vectors().Responses {
		b, _ := hex.DecodeString(v.Hex)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var r Response
		n, err := DecodeResponse(b, MaxDataLen, &r)
		if err != nil {
			return
		}
		if got := AppendResponse(nil, &r); !bytes.Equal(got, b[:n]) {
			t.Fatalf("round trip differs")
		}
	})
}

// FuzzHandshake feeds arbitrary bytes to every handshake decoder: each accepts exactly its own
// frame and round-trips it (reserved bytes, which decoders ignore, read as zero).
func FuzzHandshake(f *testing.F) {
	for _, v := range Vectors().Handshake {
		b, _ := hex.DecodeString(v.Hex)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var h Hello
		if DecodeHello(b, &h) == nil && !bytes.Equal(AppendHello(nil, &h), b) {
			t.Fatal("hello round trip")
		}
		var c Challenge
		if DecodeChallenge(b, &c) == nil {
			want := append([]byte(nil), b...)
			want[14], want[15] = 0, 0
			if !bytes.Equal(AppendChallenge(nil, &c), want) {
				t.Fatal("challenge round trip")
			}
		}
		var a Auth
		if DecodeAuth(b, &a) == nil && (len(b) != AuthSize || !bytes.Equal(a.Proof[:], b[8:])) {
			t.Fatal("auth decode")
		}
		var w Welcome
		if DecodeWelcome(b, &w) == nil {
			want := append([]byte(nil), b...)
			want[7] = 0
			if !bytes.Equal(AppendWelcome(nil, &w), want) {
				t.Fatal("welcome round trip")
			}
		}
	})
}
