// Package adminpage is the admin listener's web page: plain HTML, CSS and JavaScript, embedded
// in the binary and served as they are (no build step). The page reads the admin listener's
// JSON (/api/stats, /api/top, /api/locks, /api/key) and the launch-command generator
// (/api/deploy, registered by cmd/ticketing).
package adminpage

import (
	"embed"
	"io/fs"
	"net/http"
)

//go:embed static
var files embed.FS

// Handler serves the page's files: "/" is index.html.
func Handler() http.Handler {
	sub, err := fs.Sub(files, "static")
	if err != nil {
		panic(err) // the embedded tree is fixed at build time
	}
	return http.FileServer(http.FS(sub))
}
