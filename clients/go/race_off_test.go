//go:build !race

package ticketing

const raceEnabled = false
