package locktable

// slabChunk is the number of elements per slab chunk (a power of two).
const (
	slabBits  = 8
	slabChunk = 1 << slabBits
	slabMask  = slabChunk - 1
)

// slab is a growable array of T stored in fixed-size chunks. Growing allocates one more chunk and
// never copies or frees the others: no stall while a large table grows under the server's lock,
// and no garbage left behind by a growth spurt (a plain slice doubling would leave its old
// arrays to the garbage collector and in the process's resident memory).
type slab[T any] struct {
	chunks [][]T
	n      int32 // elements in use: indices 0..n-1
}

// at returns the element at index i (0 <= i < n).
func (s *slab[T]) at(i int32) *T { return &s.chunks[i>>slabBits][i&slabMask] }

// add appends a zero element and returns its index.
func (s *slab[T]) add() int32 {
	if int(s.n)>>slabBits == len(s.chunks) {
		s.chunks = append(s.chunks, make([]T, slabChunk))
	}
	s.n++
	return s.n - 1
}
