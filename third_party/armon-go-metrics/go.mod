module github.com/armon/go-metrics

go 1.12

require github.com/hashicorp/go-immutable-radix v1.0.0
