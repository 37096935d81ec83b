module github.com/ticketing/ticketing

go 1.24.0
