//go:build race

package ticketing

// raceEnabled: the race detector makes sync.Pool drop items at random, so allocation budgets
// are looser under it.
const raceEnabled = true
