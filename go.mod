module github.com/ticketing/ticketing

go 1.24.0

require (
	github.com/anishathalye/porcupine v1.3.1
	github.com/hashicorp/go-hclog v1.6.3
	github.com/hashicorp/go-metrics v0.5.4
	github.com/hashicorp/raft v1.7.3
	github.com/hashicorp/raft-boltdb/v2 v2.3.1
	github.com/hashicorp/raft-wal v0.4.2
	github.com/prometheus/client_model v0.6.3
	github.com/prometheus/common v0.66.1
	github.com/ticketing/ticketing/clients/go v0.0.0
	github.com/ticketing/ticketing/wire v0.0.0
	golang.org/x/sys v0.35.0
)

require (
	github.com/armon/go-metrics v0.4.1 // indirect
	github.com/benbjohnson/immutable v0.4.0 // indirect
	github.com/boltdb/bolt v1.3.1 // indirect
	github.com/coreos/etcd v3.3.27+incompatible // indirect
	github.com/coreos/go-systemd v0.0.0-20191104093116-d3cd4ed1dbcf // indirect
	github.com/coreos/pkg v0.0.0-20220810130054-c7d1c02cb6cf // indirect
	github.com/fatih/color v1.13.0 // indirect
	github.com/hashicorp/go-immutable-radix v1.3.0 // indirect
	github.com/hashicorp/go-msgpack/v2 v2.1.2 // indirect
	github.com/hashicorp/golang-lru v0.5.4 // indirect
	github.com/kr/pretty v0.3.1 // indirect
	github.com/mattn/go-colorable v0.1.12 // indirect
	github.com/mattn/go-isatty v0.0.14 // indirect
	github.com/munnerz/goautoneg v0.0.0-20191010083416-a7dc8b61c822 // indirect
	go.etcd.io/bbolt v1.3.6 // indirect
	go.yaml.in/yaml/v2 v2.4.2 // indirect
	golang.org/x/exp v0.0.0-20220827204233-334a2380cb91 // indirect
	google.golang.org/protobuf v1.36.12 // indirect
)

// The wire codec and the Go client are modules of their own (a user of the client takes on
// none of the server's dependencies); in this repository they are used from their folders.
replace (
	github.com/ticketing/ticketing/clients/go => ./clients/go
	github.com/ticketing/ticketing/wire => ./wire
)

// Raft's codec without its net/rpc codec and code generator: they are never called here, but
// linking them ran the initialisers of net/rpc, encoding/gob, html/template and go/parser at
// every start and kept about 400 KiB of the binary resident (third_party/go-msgpack/README.md).
replace github.com/hashicorp/go-msgpack/v2 => ./third_party/go-msgpack

// go-metrics (Raft's metrics, through hashicorp/go-metrics/compat) without the one method that
// imports net/http (InmemSink.DisplayMetrics, an HTTP handler nothing here calls): linking it put
// net/http's packages and initialisers in every process (third_party/armon-go-metrics/README.md).
replace github.com/armon/go-metrics => ./third_party/armon-go-metrics
