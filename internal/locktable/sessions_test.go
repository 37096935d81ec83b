package locktable

import "testing"

// keyHash must tell apart keys that differ in one byte, in length only, or in trailing zeros.
func TestKeyHashSeparatesNearKeys(t *testing.T) {
	seen := map[uint32]string{}
	add := func(k string) {
		h := keyHash([]byte(k))
		if o, ok := seen[h]; ok && o != k {
			t.Fatalf("keyHash(%q) == keyHash(%q)", k, o)
		}
		seen[h] = k
	}
	base := "order-000000-abcdefgh"
	for i := 0; i <= len(base); i++ {
		add(base[:i])
		add(base[:i] + "\x00")
		for _, c := range []byte("019az\x00\xff") {
			b := []byte(base)
			if i < len(b) {
				b[i] = c
				add(string(b))
			}
		}
	}
}
