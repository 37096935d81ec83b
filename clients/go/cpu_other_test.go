//go:build !unix

package ticketing

import "time"

// processCPU is unknown here.
func processCPU() time.Duration { return -1 }
