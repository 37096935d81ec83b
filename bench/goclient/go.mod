// The Go client's benchmark program (bench/clients.go runs it). Its own module, so that the
// harness's module does not take on the root module's requirements: a dependency added to the
// server cannot break the harness's build, only this program's (then reported as skipped).
module github.com/ticketing/ticketing/bench/goclient

go 1.24.0

require github.com/ticketing/ticketing v0.0.0

replace github.com/ticketing/ticketing => ../..
