using System;
using System.Diagnostics;
using System.Threading;
using System.Threading.Tasks;
using NUnit.Framework;
using Ticketing.Protocol;

namespace Ticketing.Tests
{
    /// <summary>The local deadline of PROTOCOL.md's "The lost signal" against the scripted server.</summary>
    public partial class FakeServerTests
    {
        private const double RateFactor = 1 - 2 * Wire.ClockRateBoundPpm / 1e6;

        /// <summary>
        /// Asserts that the lock's deadline is no later than <paramref name="latest"/> (2 ms allowed)
        /// and no earlier than <paramref name="earliest"/> (5 ms allowed), both
        /// <see cref="Stopwatch"/> timestamps: the deadline clock runs with it while the host is not
        /// suspended.
        /// </summary>
        private static void AssertDeadline(TicketingLock l, long earliest, long latest)
        {
            long before = Stopwatch.GetTimestamp();
            long left = Clock.FromMs(l.TimeLeft.TotalMilliseconds);
            long after = Stopwatch.GetTimestamp();
            // The deadline lies between before + left and after + left.
            double late = Clock.ToMs(before + left - latest);
            double early = Clock.ToMs(earliest - (after + left));
            Assert.LessOrEqual(late, 2, "the deadline is " + late.ToString("F1") + " ms after the rule's latest");
            Assert.LessOrEqual(early, 5, "the deadline is " + early.ToString("F1") + " ms before the rule's earliest");
        }

        [Test]
        public void AGrantReadAfterTheResendCountsFromTheFirstSend()
        {
            TicketingClient c = Connect();
            long t0 = Stopwatch.GetTimestamp();
            Task<TicketingLock> f = c.AcquireAsync("k", TimeSpan.FromSeconds(3));
            long t1 = Stopwatch.GetTimestamp(); // the first send is in between
            FakeServer.Received first = _server.Expect(Op.Acquire);
            var sinceArrival = Stopwatch.StartNew();
            Thread.Sleep(100);
            // The session resumes on a connection whose WELCOME comes late; meanwhile the lock is
            // handed to the session, so its answer comes after the client re-sent the ACQUIRE.
            _server.WelcomeDelayMs = 300;
            int hellos = _server.Hellos.Count;
            first.Conn.Kill();
            Poll.Until(TimeSpan.FromSeconds(5), () => _server.Hellos.Count > hellos, "the reconnect");
            uint queued = (uint)sinceArrival.ElapsedMilliseconds;
            FakeServer.Received retry = _server.Expect(Op.Acquire);
            Assert.AreEqual(first.Id, retry.Id);
            retry.Conn.Reply(retry.Frame, Status.Ok, 7, 3000, queued);
            TicketingLock l = Tasks.Result(f);
            long span = Clock.FromMs((queued + 3000) * RateFactor);
            AssertDeadline(l, t0 + span, t1 + span);
        }

        [Test]
        public void AWaiterGrantedLongAfterItsResendCountsItsQueuedTime()
        {
            TicketingClient c = Connect();
            long t0 = Stopwatch.GetTimestamp();
            Task<TicketingLock> f = c.AcquireAsync("k", TimeSpan.FromSeconds(3));
            long t1 = Stopwatch.GetTimestamp();
            FakeServer.Received first = _server.Expect(Op.Acquire);
            var sinceArrival = Stopwatch.StartNew();
            first.Conn.Kill();
            FakeServer.Received retry = _server.Expect(Op.Acquire);
            Assert.AreEqual(first.Id, retry.Id);
            Thread.Sleep(1000); // queued on; then the lock is handed over
            uint queued = (uint)sinceArrival.ElapsedMilliseconds;
            retry.Conn.Reply(retry.Frame, Status.Ok, 7, 3000, queued);
            TicketingLock l = Tasks.Result(f);
            long span = Clock.FromMs((queued + 3000) * RateFactor);
            AssertDeadline(l, t0 + span, t1 + span);
        }

        [Test]
        public void AnOlderExtendAnsweredAfterANewerOneLeavesTheDeadline()
        {
            TicketingClient c = Connect();
            TicketingLock l = Held(c, "k", 8);
            Task<TimeSpan> older = l.ExtendAsync(TimeSpan.FromHours(1));
            FakeServer.Received e1 = _server.Expect(Op.Extend);
            long t0 = Stopwatch.GetTimestamp();
            Task<TimeSpan> newer = l.ExtendAsync(TimeSpan.FromSeconds(2));
            long t1 = Stopwatch.GetTimestamp();
            FakeServer.Received e2 = _server.Expect(Op.Extend);
            Assert.Greater(e2.Id, e1.Id);
            // The server applied the hour, then the 2 s; the answers are read the other way round.
            e2.Conn.Reply(e2.Frame, Status.Ok, 8, 2000);
            Assert.AreEqual(TimeSpan.FromSeconds(2), Tasks.Result(newer));
            e1.Conn.Reply(e1.Frame, Status.Ok, 8, 3600000);
            Assert.AreEqual(TimeSpan.FromHours(1), Tasks.Result(older), "the call still returns its own answer");
            Assert.AreEqual(TimeSpan.FromSeconds(2), l.Lease);
            long span = Clock.FromMs(2000 * RateFactor);
            AssertDeadline(l, t0 + span, t1 + span);
        }

        /// <summary>Stands for CLOCK_BOOTTIME: the test says how long the host was suspended.</summary>
        private sealed class FakeSuspend : ISuspendSource
        {
            internal long Ticks;

            public long Suspended()
            {
                return Volatile.Read(ref Ticks);
            }
        }

        [Test]
        public void ASuspendLosesTheLockWithinTheLostCheck()
        {
            var suspend = new FakeSuspend();
            TicketingClient c = Connect(o => o.DeadlineClock = new SuspendClock(suspend));
            TicketingLock watched = Held(c, "w", 8);
            TicketingLock asked = Held(c, "a", 9);
            Thread.Sleep(Wire.LostCheckMs + 50);
            Assert.IsFalse(watched.IsLost);
            // The host slept a minute: both 30 s leases ran out, and no runtime timer counted it.
            Volatile.Write(ref suspend.Ticks, Clock.FromMs(60000));
            var sw = Stopwatch.StartNew();
            Assert.IsTrue(asked.IsLost, "asking checks the deadline at once");
            Assert.AreEqual(LostReason.Expired, asked.LostReason);
            Assert.AreEqual(LostReason.Expired, Tasks.Result(watched.Lost));
            Assert.Less(sw.ElapsedMilliseconds, Wire.LostCheckMs + 250, "lost within the lost check's period (and some scheduling)");
            Assert.Less(watched.TimeLeft, TimeSpan.FromSeconds(-29));
        }
    }
}
