package main

import (
	"bytes"
	"fmt"

	"github.com/ticketing/ticketing/internal/adminhttp"
	"github.com/ticketing/ticketing/internal/server"
)

// What the operations side (metrics, the admin page, the launch-command generator) takes from
// the settings table in serve.go, and the one setting it adds there.

// metricsSetting is TICKETING_METRICS: on (default) or off. Off turns off the lock-event
// metrics and the contention sketch (their cost on the request path is measured by
// BenchmarkRequestPathMetrics); /metrics keeps the series read when scraped.
func metricsSetting(off *bool) setting {
	def := "on"
	if *off {
		def = "off"
	}
	return setting{"metrics", "lock-event metrics and the contention sketch on the admin listener: on or off", func(v string) error {
		switch v {
		case "on", "true", "1":
			*off = false
		case "off", "false", "0":
			*off = true
		default:
			return fmt.Errorf("want on or off")
		}
		return nil
	}, def}
}

// startOps wires the operations side into a server built by runServer, before it serves:
// metrics (unless TICKETING_METRICS=off) and the generator's route on the admin listener.
func startOps(srv *server.Server, o *serverSettings) {
	if !o.metricsOff {
		srv.EnableMetrics()
	}
	srv.AdminMux().Handle("POST /api/deploy", serveDeploy)
}

// settingsTable is the server's settings table (serve.go, list) by flag name, on a scratch
// serverSettings with the defaults: the generator writes only names found here, and every
// value it writes is parsed by the setter found here.
func settingsTable() (map[string]setting, []string) {
	o := newServerSettings()
	byName := map[string]setting{}
	var order []string
	for _, st := range o.list() {
		byName[st.name] = st
		order = append(order, st.name)
	}
	return byName, order
}

// serveDeploy is POST /api/deploy: the launch-command generator for the admin page. The body
// is a deployRequest in JSON; the answer a deployPlan (400 with the reason when the answers do
// not make a configuration the server accepts).
func serveDeploy(w *adminhttp.Response, r *adminhttp.Request) {
	var req deployRequest
	if len(r.Body) > 64<<10 {
		w.Error(413, "body over 65536 bytes")
		return
	}
	if err := decodeJSON(bytes.NewReader(r.Body), &req); err != nil {
		w.Error(400, "bad JSON: "+err.Error())
		return
	}
	plan, err := generateDeploy(req)
	if err != nil {
		w.Error(400, err.Error())
		return
	}
	w.Set("Content-Type", "application/json")
	w.Set("Cache-Control", "no-store")
	encodeJSON(w, plan)
}
