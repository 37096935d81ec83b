// The redsync incumbent's benchmark program (bench/clients.go runs it through bench-run.sh): its
// own module, so that the harness's module does not take on redsync and go-redis.
module github.com/ticketing/ticketing/bench/incumbents/redsync

go 1.26.0

require (
	github.com/go-redsync/redsync/v4 v4.18.1
	github.com/redis/go-redis/v9 v9.23.0
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	golang.org/x/sys v0.48.0 // indirect
)
