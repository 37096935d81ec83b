using System;
using System.Diagnostics;
using System.Threading;
using System.Threading.Tasks;
using Ticketing.Protocol;

namespace Ticketing
{
    /// <summary>
    /// One request and its life in the engine. Every mutable field is guarded by the engine's lock
    /// (<c>Engine._mu</c>); <see cref="Answer"/> and <see cref="Settled"/> are completed outside it,
    /// and their continuations run on the thread pool, never inline.
    /// </summary>
    internal sealed class Request
    {
        internal readonly Op Op;
        internal readonly byte[] Key;
        internal readonly ulong Token;
        internal readonly uint LeaseMs;
        internal readonly uint WaitMs;

        /// <summary>Sent by the client for itself (clean-up, heartbeat, ACK): allowed while closing.</summary>
        internal readonly bool Internal;

        /// <summary>Completes once: with the answer, or with the error that ended the request.</summary>
        internal readonly TaskCompletionSource<ResponseFrame> Answer =
            new TaskCompletionSource<ResponseFrame>(TaskCreationOptions.RunContinuationsAsynchronously);

        /// <summary>Completes when the server holds nothing more for this request (after any clean-up).</summary>
        internal readonly TaskCompletionSource<bool> Settled =
            new TaskCompletionSource<bool>(TaskCreationOptions.RunContinuationsAsynchronously);

        internal ulong Id; // 0 until the frame is queued for the wire
        internal long FirstSent; // the deadline clock (SuspendClock) at the first send; a re-send keeps it
        internal long Generation; // the engine's state generation when first sent
        internal TimerEntry Timer;
        internal bool Done; // Answer completed (or about to be)
        internal bool Abandoned; // an ACQUIRE whose caller gave up: withdraw it, release any grant
        internal bool CancelSent; // the CANCEL for an abandoned ACQUIRE is on its way
        internal bool NotRun; // answered NOT_LEADER: never run; send again after the reconnect

        internal Request(Op op, byte[] key, ulong token, uint leaseMs, uint waitMs, bool isInternal)
        {
            Op = op;
            Key = key ?? new byte[0];
            Token = token;
            LeaseMs = leaseMs;
            WaitMs = waitMs;
            Internal = isInternal;
        }

        internal byte[] Encode()
        {
            return new RequestFrame(Op, Id, Token, LeaseMs, WaitMs, Key).Encode();
        }

        internal void CancelTimer()
        {
            if (Timer != null)
            {
                Timer.Dispose();
                Timer = null;
            }
        }

        /// <summary>What the request is, for messages: "ACQUIRE of \"k\"".</summary>
        internal string Describe()
        {
            return Dialer.Upper(Op.ToString()) + (Key.Length > 0 ? " of " + Args.Printable(Key) : "");
        }
    }

    /// <summary>Monotonic time in <see cref="Stopwatch"/> ticks, and actions that run once after a delay.</summary>
    internal static class Clock
    {
        internal static long Now => Stopwatch.GetTimestamp();

        internal static long FromMs(double ms)
        {
            return (long)(ms * Stopwatch.Frequency / 1000.0);
        }

        internal static double ToMs(long ticks)
        {
            return ticks * 1000.0 / Stopwatch.Frequency;
        }

        internal static TimeSpan ToTimeSpan(long ticks)
        {
            return TimeSpan.FromTicks((long)(ticks * (double)TimeSpan.TicksPerSecond / Stopwatch.Frequency));
        }

        /// <summary>
        /// Runs <paramref name="action"/> once after <paramref name="delayMs"/> on the client's timer
        /// thread (<see cref="TimerQueue"/>); dispose the entry to cancel it.
        /// </summary>
        internal static TimerEntry Once(double delayMs, Action action)
        {
            return TimerQueue.Shared.Once(delayMs, action);
        }
    }
}
