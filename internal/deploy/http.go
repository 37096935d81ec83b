package deploy

import (
	"bytes"
	"encoding/json"
	"io"
	"math"

	"github.com/ticketing/ticketing/internal/adminhttp"
)

// ServeDeploy is POST /api/deploy on the admin listener: the generator for the admin page. The
// body is a Request in JSON; the answer a Plan (400 with the reason when the answers do not
// make a configuration the server accepts). A port left out is the default; a port given as 0
// is refused (it never silently becomes 7070).
func ServeDeploy(w *adminhttp.Response, r *adminhttp.Request) {
	if len(r.Body) > 64<<10 {
		w.Error(413, "body over 65536 bytes")
		return
	}
	req := Request{Port: notGiven, RaftPort: notGiven}
	if err := decodeJSON(bytes.NewReader(r.Body), &req); err != nil {
		w.Error(400, "bad JSON: "+err.Error())
		return
	}
	for _, p := range []struct {
		name string
		v    *int
	}{{"port", &req.Port}, {"raft port", &req.RaftPort}} {
		switch *p.v {
		case notGiven:
			*p.v = 0 // the default
		case 0:
			w.Error(400, p.name+" 0: give the port the node listens on (1..65534), or leave it out for the default")
			return
		}
	}
	plan, err := Generate(req)
	if err != nil {
		w.Error(400, err.Error())
		return
	}
	w.Set("Content-Type", "application/json")
	w.Set("Cache-Control", "no-store")
	plan.WriteJSON(w)
}

// notGiven marks a port the body leaves out.
const notGiven = math.MinInt32

func decodeJSON(r io.Reader, v any) error {
	d := json.NewDecoder(r)
	d.DisallowUnknownFields()
	return d.Decode(v)
}

// WriteJSON writes the plan as indented JSON (the answer of POST /api/deploy, and of
// `ticketing deploy --format json`).
func (p *Plan) WriteJSON(w io.Writer) {
	e := json.NewEncoder(w)
	e.SetIndent("", "  ")
	e.Encode(p)
}
