//go:build race

package locktable

// raceOn: the race detector slows the randomized tests ~10x; they run fewer seeds under it.
const raceOn = true
