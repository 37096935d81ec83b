// The Go client, a module of its own, as etcd's client is: an application that uses it takes on
// the wire codec (standard library only) and nothing of the server's (Raft, bolt, Prometheus).
// Its tests start the real server with the repository's test harness (internal/testserver of
// the root module, through the replace below); the library itself never imports the server.
module github.com/ticketing/ticketing/clients/go

go 1.24.0

require (
	github.com/ticketing/ticketing v0.0.0
	github.com/ticketing/ticketing/wire v0.0.0
)

replace (
	github.com/ticketing/ticketing => ../..
	github.com/ticketing/ticketing/wire => ../../wire
)
