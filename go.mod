module github.com/ticketing/ticketing

go 1.26.8
