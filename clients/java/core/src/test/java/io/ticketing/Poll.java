package io.ticketing;

import java.time.Duration;
import java.util.function.BooleanSupplier;

/** Polls a condition with a deadline: the tests' only way to wait for something asynchronous. */
final class Poll {
    private Poll() {
    }

    static void until(Duration timeout, BooleanSupplier condition, String what) throws InterruptedException {
        long deadline = System.nanoTime() + timeout.toNanos();
        while (!condition.getAsBoolean()) {
            if (System.nanoTime() > deadline) {
                throw new AssertionError("timed out after " + timeout + " waiting for " + what);
            }
            Thread.sleep(5);
        }
    }
}
