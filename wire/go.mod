module github.com/ticketing/ticketing/wire

go 1.24.0
