using System;
using System.Collections.Generic;
using System.Linq;
using System.Threading;
using System.Threading.Tasks;
using NUnit.Framework;
using Ticketing.Protocol;

namespace Ticketing.Tests
{
    /// <summary>
    /// The paths the common calls take against the scripted server: a lock's deadline timer armed
    /// only near the lost time, lost signals made when first asked for, acquire and release
    /// answered without an async method, frames encoded into the connection's write buffer.
    /// </summary>
    public partial class FakeServerTests
    {
        /// <summary>Acquires <paramref name="key"/>, answered with <paramref name="leaseMs"/>.</summary>
        private TicketingLock Granted(TicketingClient c, string key, uint leaseMs, ulong token)
        {
            Task<TicketingLock> f = c.AcquireAsync(key, TimeSpan.FromMilliseconds(leaseMs));
            FakeServer.Received r = _server.Expect(Op.Acquire);
            r.Conn.Reply(r.Frame, Status.Ok, token, leaseMs);
            return Tasks.Result(f);
        }

        [Test]
        public void ADeadlineFarOffIsLeftToTheLostCheckUntilItIsNear()
        {
            TicketingClient c = Connect();
            // The lost time is 2.5 s away at the grant: beyond the window, so no timer yet.
            TicketingLock l = Granted(c, "far", 2500, 11);
            Assert.IsFalse(l.DeadlineTimerArmed, "no timer while the lost time is more than " + TicketingLock.DeadlineTimerWindowMs + " ms away");
            // The lost check arms it within the window, before the lost time...
            Poll.Until(TimeSpan.FromSeconds(5), () => l.DeadlineTimerArmed || l.IsLost, "the deadline timer armed by the lost check");
            Assert.IsTrue(l.DeadlineTimerArmed, "armed before the lock was lost");
            // ...and the signal fires (the timer, or the lost check if the timer thread is late).
            Assert.AreEqual(LostReason.Expired, Tasks.Result(l.Lost));
            Assert.IsTrue(l.HandleLostToken.IsCancellationRequested);
            Assert.IsFalse(l.DeadlineTimerArmed, "a lost lock keeps no timer");
        }

        [Test]
        public void AnExtendFarOffDisarmsTheDeadlineTimerAndANearOneArmsIt()
        {
            TicketingClient c = Connect();
            TicketingLock l = Granted(c, "ext", 900, 12); // within the window: armed at once
            Assert.IsTrue(l.DeadlineTimerArmed || l.IsLost, "armed at the grant");
            Task<TimeSpan> far = l.ExtendAsync(TimeSpan.FromSeconds(30));
            FakeServer.Received e = _server.Expect(Op.Extend);
            e.Conn.Reply(e.Frame, Status.Ok, 12, 30000);
            Assert.AreEqual(TimeSpan.FromSeconds(30), Tasks.Result(far));
            Assert.IsFalse(l.DeadlineTimerArmed, "30 s away: left to the lost check");
            Task<TimeSpan> near = l.ExtendAsync(TimeSpan.FromMilliseconds(800));
            e = _server.Expect(Op.Extend);
            e.Conn.Reply(e.Frame, Status.Ok, 12, 800);
            Tasks.Result(near);
            Assert.IsTrue(l.DeadlineTimerArmed || l.IsLost, "800 ms away: armed");
            Task release = l.ReleaseAsync();
            FakeServer.Received rel = _server.Expect(Op.Release);
            rel.Conn.Reply(rel.Frame, Status.Ok, 12);
            Tasks.Ok(release);
            Assert.IsFalse(l.DeadlineTimerArmed, "a released lock keeps no timer");
        }

        [Test]
        public void LostSignalsAskedForOnlyAfterTheLossAreFiredAlready()
        {
            TicketingClient c = Connect();
            TicketingLock l = Granted(c, "late", 300, 13);
            Poll.Until(TimeSpan.FromSeconds(5), () => l.IsLost, "the lock lost at its deadline");
            // Neither the token nor the task existed when the lock was lost.
            Assert.AreEqual(LostReason.Expired, Tasks.Result(l.Lost));
            Assert.IsTrue(l.HandleLostToken.WaitHandle.WaitOne(5000), "the token is cancelled");
            var heard = new TaskCompletionSource<bool>();
            l.HandleLostToken.Register(() => heard.TrySetResult(true)); // runs at once: cancelled already
            Assert.IsTrue(Tasks.Result(heard.Task));
            Assert.AreSame(l.Lost, l.Lost, "one task");
            Assert.AreEqual(l.HandleLostToken, l.HandleLostToken, "one token");
        }

        [Test]
        public void ReleaseFailuresReachTheCallerAndAllowARetry()
        {
            TicketingClient c = Connect();
            TicketingLock l = Granted(c, "rel", 10000, 14);
            // A status other than OK or NOT_HELD fails the release; the lock may be released again.
            Task first = l.ReleaseAsync();
            FakeServer.Received r = _server.Expect(Op.Release);
            r.Conn.Reply(r.Frame, Status.Busy, 0, 0, 0);
            Tasks.Failure<BusyException>(first);
            Assert.IsFalse(l.IsReleased);
            Task second = l.ReleaseAsync();
            Assert.AreNotSame(first, second);
            r = _server.Expect(Op.Release);
            r.Conn.Reply(r.Frame, Status.Ok, 14);
            Tasks.Ok(second);
            Assert.IsTrue(l.IsReleased);
            Assert.IsFalse(l.IsLost);
        }

        [Test]
        public void AcquireAndReleaseAfterCloseFailAsClosedInTheirTasks()
        {
            TicketingClient c = Connect();
            TicketingLock l = Granted(c, "closed", 10000, 15);
            c.Dispose();
            Task<TicketingLock> acquire = c.TryAcquireAsync("other", TimeSpan.FromSeconds(1));
            Tasks.Failure<ClosedException>(acquire);
            Tasks.Failure<ClosedException>(l.ReleaseAsync());
            l.Dispose(); // disposing after close does nothing
        }

        [Test]
        public void FramesBeyondTheWriteBufferGoOutWholeAndInOrder()
        {
            TicketingClient c = Connect();
            // Keys of 20,000 bytes among small ones: the write buffer (16 KiB) grows for them, and
            // every frame reaches the server whole, in request id order.
            var calls = new List<Task<TicketingLock>>();
            var keys = new List<string>();
            for (int i = 0; i < 12; i++)
            {
                string key = i % 3 == 0 ? new string((char)('a' + i), 20000) : "small-" + i;
                keys.Add(key);
                calls.Add(Task.Run(() => c.TryAcquireAsync(key, TimeSpan.FromSeconds(10))));
            }
            var seen = new List<FakeServer.Received>();
            for (int i = 0; i < keys.Count; i++)
            {
                seen.Add(_server.Expect(Op.Acquire));
            }
            CollectionAssert.AreEquivalent(keys, seen.Select(r => System.Text.Encoding.UTF8.GetString(r.Frame.Key)).ToList());
            for (int i = 1; i < seen.Count; i++)
            {
                Assert.Greater(seen[i].Id, seen[i - 1].Id, "in request id order");
            }
            ulong token = 100;
            foreach (FakeServer.Received r in seen)
            {
                r.Conn.Reply(r.Frame, Status.Ok, ++token, 10000);
            }
            foreach (Task<TicketingLock> t in calls)
            {
                Assert.IsNotNull(Tasks.Result(t));
            }
        }
    }
}
