// The Go client's benchmark program (bench/clients.go runs it). Its own module, so that the
// harness's module does not take on the client's requirements: a change to the client cannot
// break the harness's build, only this program's (then reported as skipped).
module github.com/ticketing/ticketing/bench/goclient

go 1.24.0

require github.com/ticketing/ticketing/clients/go v0.0.0

require github.com/ticketing/ticketing/wire v0.0.0 // indirect

replace (
	github.com/ticketing/ticketing => ../..
	github.com/ticketing/ticketing/clients/go => ../../clients/go
	github.com/ticketing/ticketing/wire => ../../wire
)
