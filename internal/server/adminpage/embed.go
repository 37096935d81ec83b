// Package adminpage is the admin listener's web page: plain HTML, CSS and JavaScript, embedded
// in the binary and served as they are (no build step). The page reads the admin listener's
// JSON (/api/stats, /api/top, /api/locks, /api/key) and the launch-command generator
// (/api/deploy, registered by cmd/ticketing).
package adminpage

import (
	"embed"
	"path"
	"strings"

	"github.com/ticketing/ticketing/internal/adminhttp"
)

//go:embed static
var files embed.FS

var types = map[string]string{
	".html": "text/html; charset=utf-8",
	".css":  "text/css; charset=utf-8",
	".js":   "text/javascript; charset=utf-8",
}

// Handler serves the page's files below prefix ("/ui/"); "/" is index.html.
func Handler(prefix string) adminhttp.Handler {
	return func(w *adminhttp.Response, r *adminhttp.Request) {
		name := "index.html"
		if r.Path != "/" {
			name = strings.TrimPrefix(r.Path, prefix)
		}
		b, err := files.ReadFile("static/" + path.Clean("/" + name)[1:])
		if err != nil || name == "" {
			w.Error(404, "404 page not found")
			return
		}
		if t, ok := types[path.Ext(name)]; ok {
			w.Set("Content-Type", t)
		}
		w.Write(b)
	}
}
