module github.com/hashicorp/go-msgpack/v2

go 1.19
