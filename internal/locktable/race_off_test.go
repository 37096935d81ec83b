//go:build !race

package locktable

const raceOn = false
