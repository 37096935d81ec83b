//go:build !linux

package ticketing

import "time"

func newSuspendSource(start time.Time) suspendSource { return newWallSource(start) }
