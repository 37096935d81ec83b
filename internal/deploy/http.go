package deploy

import (
	"bytes"
	"encoding/json"
	"io"

	"github.com/ticketing/ticketing/internal/adminhttp"
)

// ServeDeploy is POST /api/deploy on the admin listener: the generator for the admin page. The
// body is a Request in JSON; the answer a Plan (400 with the reason when the answers do not
// make a configuration the server accepts).
func ServeDeploy(w *adminhttp.Response, r *adminhttp.Request) {
	var req Request
	if len(r.Body) > 64<<10 {
		w.Error(413, "body over 65536 bytes")
		return
	}
	if err := decodeJSON(bytes.NewReader(r.Body), &req); err != nil {
		w.Error(400, "bad JSON: "+err.Error())
		return
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
