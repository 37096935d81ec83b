package ticketing

// callTable holds the calls sent and not yet answered, by request id: cheaper than a map on a
// path every call takes twice. A call's slot is its id's low bits. Request ids are handed out in
// sequence, so the calls in flight, mostly a window of recent ids, have distinct slots as long
// as the table is at least twice as large as their number (it grows to stay so); a call whose
// slot is taken (by one much older: a long wait) goes to an overflow map. A call's id
// (cl.req.ID) must not change while it is in the table. Guarded by Client.mu.
type callTable struct {
	slots []*call          // nil, or a power of two of them
	over  map[uint64]*call // calls whose slot was taken when they were added
	n     int              // calls in slots and over
}

func (t *callTable) len() int { return t.n }

func (t *callTable) get(id uint64) *call {
	if t.n == 0 {
		return nil
	}
	if cl := t.slots[id&uint64(len(t.slots)-1)]; cl != nil && cl.req.ID == id {
		return cl
	}
	return t.over[id] // (nil map: nil)
}

// put adds cl, whose id is not in the table.
func (t *callTable) put(cl *call) {
	if 2*(t.n+1) > len(t.slots) {
		t.resize(max(64, 2*len(t.slots)))
	}
	t.add(cl)
	t.n++
}

func (t *callTable) add(cl *call) {
	i := cl.req.ID & uint64(len(t.slots)-1)
	if t.slots[i] == nil {
		t.slots[i] = cl
		return
	}
	if t.over == nil {
		t.over = make(map[uint64]*call)
	}
	t.over[cl.req.ID] = cl
}

// del removes the call with this id and returns it (nil if there is none).
func (t *callTable) del(id uint64) *call {
	if t.n == 0 {
		return nil
	}
	i := id & uint64(len(t.slots)-1)
	cl := t.slots[i]
	switch {
	case cl != nil && cl.req.ID == id:
		t.slots[i] = nil
	case t.over[id] != nil:
		cl = t.over[id]
		delete(t.over, id)
		if len(t.over) == 0 {
			t.over = nil
		}
	default:
		return nil
	}
	t.n--
	if len(t.slots) > 4096 && 16*t.n < len(t.slots) {
		t.resize(len(t.slots) / 4) // do not keep a burst's array forever
	}
	return cl
}

func (t *callTable) resize(size int) {
	all := t.calls(nil)
	t.slots, t.over = make([]*call, size), nil
	for _, cl := range all {
		t.add(cl)
	}
}

// calls appends every call in the table to dst, in no order.
func (t *callTable) calls(dst []*call) []*call {
	for _, cl := range t.slots {
		if cl != nil {
			dst = append(dst, cl)
		}
	}
	for _, cl := range t.over {
		dst = append(dst, cl)
	}
	return dst
}

// clear empties the table.
func (t *callTable) clear() {
	t.slots, t.over, t.n = nil, nil, 0
}
