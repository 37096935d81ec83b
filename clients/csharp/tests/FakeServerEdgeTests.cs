using System;
using System.Collections.Generic;
using System.Diagnostics;
using System.Linq;
using System.Text;
using System.Threading;
using System.Threading.Tasks;
using NUnit.Framework;
using Ticketing.Protocol;

namespace Ticketing.Tests
{
    /// <summary>
    /// The edges every client must agree on (tests/conformance/SCENARIOS.md, docs/clients.md) against
    /// the scripted server: a lost lock's release, the first call after a restart, the heartbeat's
    /// replacement of a silent connection, the handshake's deadline, the start-up wait.
    /// </summary>
    public partial class FakeServerTests
    {
        [Test]
        public void ReleaseOfALostLockAnswersAtOnceAndTellsTheServerInTheBackground()
        {
            TicketingClient c = Connect();
            Task<TicketingLock> f = c.AcquireAsync("k", TimeSpan.FromMilliseconds(200));
            Grant(_server.Expect(Op.Acquire), 8);
            TicketingLock l = Tasks.Result(f);
            Assert.AreEqual(LostReason.Expired, Tasks.Result(l.Lost));
            var sw = Stopwatch.StartNew();
            Task rel = l.ReleaseAsync();
            Assert.IsTrue(rel.IsCompleted, "the release of a lock known lost waited for the server");
            Assert.AreEqual(LostReason.Expired, Tasks.Failure<LockLostException>(rel).Reason);
            Assert.Less(sw.ElapsedMilliseconds, 500);
            // The server is still told (it may not have reclaimed the lock yet); its answer, or none,
            // changes nothing.
            FakeServer.Received told = _server.Expect(Op.Release);
            Assert.AreEqual(8UL, told.Frame.Token);
            Assert.IsTrue(l.IsReleased);
            Tasks.Ok(l.ReleaseAsync()); // again: nothing
            Assert.IsNull(_server.Poll(200));
        }

        [Test]
        public void ReleaseOfALockLostToTheServerStoppingAnswersAtOnceWhileTheServerIsGone()
        {
            TicketingClient c = Connect(o => o.RequestTimeout = TimeSpan.FromSeconds(20));
            TicketingLock l = Held(c, "k", 8);
            FakeServer.Conn conn = _server.NextConnection();
            conn.Send(new ResponseFrame(Op.Expired, Status.Ok, 0, 8, 0, (uint)ExpiredReason.Stopping, Bytes("k")));
            Assert.AreEqual(LostReason.ServerStopping, Tasks.Result(l.Lost));
            _server.Refuse = (int)Status.Busy; // nobody serves now: the background RELEASE waits
            _server.KillAll();
            var sw = Stopwatch.StartNew();
            Assert.AreEqual(LostReason.ServerStopping, Tasks.Failure<LockLostException>(l.ReleaseAsync()).Reason);
            Assert.Less(sw.ElapsedMilliseconds, 1000);
        }

        [Test]
        public void FirstCallAfterARestartGoesToTheNewServer()
        {
            TicketingClient c = Connect(o => o.HeartbeatInterval = TimeSpan.Zero);
            string oldSession = c.SessionId;
            _server.NextConnection(); // (so that KillAll finds it)
            _server.Refuse = (int)Status.Busy; // down for a while
            _server.KillAll();
            Poll.Until(TimeSpan.FromSeconds(5), () => _server.Hellos.Count >= 2, "a reconnect attempt");
            Task<TimeSpan> ping = c.PingAsync(); // made while disconnected: it never reaches the old server
            Task<TicketingLock> acq = c.AcquireAsync("k", TimeSpan.FromSeconds(5), TimeSpan.Zero);
            Thread.Sleep(200);
            Assert.IsFalse(ping.IsCompleted);
            _server.NewStateId(); // restarted
            _server.Refuse = -1;
            Tasks.Result(ping);
            FakeServer.Received a = _server.Expect(Op.Acquire);
            Assert.AreEqual(Op.Acquire, a.Op);
            Grant(a, 3);
            Assert.AreEqual(3UL, Tasks.Result(acq).Token, "an acquire never sent to the old state is granted by the new one");
            Assert.AreNotEqual(oldSession, c.SessionId);
        }

        [Test]
        public void SilentConnectionIsReplacedAndTheCallInFlightGoesOn()
        {
            // Default heartbeat (2 s) and request timeout (10 s): while a request waits, a PING goes
            // after 250 ms of silence and may stay unanswered 750 ms; then the session resumes on a
            // new connection and the acquire, re-sent there, is not failed.
            TicketingClient c = Connect();
            FakeServer.Conn first = _server.NextConnection();
            var sw = Stopwatch.StartNew();
            Task<TicketingLock> f = c.AcquireAsync("k", TimeSpan.FromSeconds(5));
            FakeServer.Received a = _server.Expect(Op.Acquire);
            _server.AutoPing = false;
            FakeServer.Received ping = _server.Expect(Op.Ping); // never answered
            Assert.AreSame(first, ping.Conn);
            _server.AutoPing = true;
            FakeServer.Conn second = _server.NextConnection();
            Assert.IsTrue(second.Resumed, "the session was not resumed on the new connection");
            FakeServer.Received again = _server.Expect(Op.Acquire);
            Assert.AreSame(second, again.Conn);
            Assert.AreEqual(a.Id, again.Id, "re-sent with its id");
            Assert.Less(sw.ElapsedMilliseconds, 3000, "a silent connection is left within about 1 s");
            Assert.IsFalse(f.IsCompleted, "the call in flight failed: " + f.Exception);
            Grant(again, 11);
            Assert.AreEqual(11UL, Tasks.Result(f).Token);
        }

        [Test]
        public void SilentNodeIsTriedLast()
        {
            var other = Closing(new FakeServer());
            other.StateId = _server.StateId;
            other.Sessions = _server.Sessions; // one replicated session table: the session resumes there
            TicketingClient c = Connect(o =>
            {
                o.Endpoints = new List<string> { _server.Endpoint, other.Endpoint };
                o.HeartbeatInterval = TimeSpan.FromMilliseconds(100);
            });
            _server.NextConnection();
            Task<TicketingLock> f = c.AcquireAsync("k", TimeSpan.FromSeconds(5));
            FakeServer.Received a = _server.Expect(Op.Acquire);
            _server.AutoPing = false; // the node freezes: its kernel still accepts connections
            _server.Expect(Op.Ping);
            FakeServer.Conn moved = other.NextConnection();
            Assert.IsTrue(moved.Resumed);
            FakeServer.Received again = other.Expect(Op.Acquire);
            Assert.AreEqual(a.Id, again.Id);
            Grant(again, 4);
            Assert.AreEqual(4UL, Tasks.Result(f).Token);
            Assert.AreEqual(1, _server.Hellos.Count, "the silent node was dialled again first");
        }

        [Test]
        public void SilentNodeIsNotFollowedAsAHint()
        {
            // The other nodes keep naming a frozen leader until they elect another one; for 2 s the
            // client follows no hint to the node it just found silent (it would accept TCP and cost
            // the handshake wait; this fake one would even resume the session) and goes on to the
            // next endpoint.
            var follower = Closing(new FakeServer());
            follower.NotLeaderHint = _server.Endpoint; // still names the frozen node as the leader
            var next = Closing(new FakeServer());
            next.StateId = _server.StateId;
            next.Sessions = _server.Sessions; // one replicated session table: the session resumes there
            TicketingClient c = Connect(o =>
            {
                o.Endpoints = new List<string> { _server.Endpoint, follower.Endpoint, next.Endpoint };
                o.HeartbeatInterval = TimeSpan.FromMilliseconds(100);
            });
            _server.NextConnection();
            Task<TicketingLock> f = c.AcquireAsync("k", TimeSpan.FromSeconds(5));
            FakeServer.Received a = _server.Expect(Op.Acquire);
            _server.AutoPing = false; // the node freezes: its kernel still accepts connections
            _server.Expect(Op.Ping);
            FakeServer.Conn moved = next.NextConnection();
            Assert.IsTrue(moved.Resumed, "the session did not resume on the third endpoint");
            FakeServer.Received again = next.Expect(Op.Acquire);
            Assert.AreEqual(a.Id, again.Id, "re-sent with its id");
            Grant(again, 5);
            Assert.AreEqual(5UL, Tasks.Result(f).Token);
            Assert.GreaterOrEqual(follower.Hellos.Count, 1, "the follower was not asked");
            Thread.Sleep(100);
            Assert.AreEqual(1, _server.Hellos.Count, "the hint to the silent node was followed");
        }

        [Test]
        public void HandshakeGetsTwoSecondsOnceTcpIsConnected()
        {
            _server.Frozen = true; // accepts, never answers
            var sw = Stopwatch.StartNew();
            var e = Assert.Throws<UnavailableException>(() => Connect(o => o.ConnectTimeout = TimeSpan.FromSeconds(8)));
            StringAssert.Contains("2000 ms of the TCP connection", e.Message);
            Assert.That(sw.ElapsedMilliseconds, Is.InRange(1900, 5000));
        }

        [Test]
        public void StartupWaitShowsInInspectAndInTheNotAcquiredMessage()
        {
            TicketingClient c = Connect();
            Task<LockInfo> i = c.InspectAsync("k");
            FakeServer.Received r = _server.Expect(Op.Inspect);
            byte[] data = new byte[12];
            data[6] = 0x0b; // lock-delay left (bytes 4 to 7): 2,816 ms
            data[11] = (byte)InspectFlags.Startup;
            r.Conn.Reply(r.Frame, Status.Ok, 0, 0, 0, data);
            LockInfo info = Tasks.Result(i);
            Assert.IsTrue(info.InStartupWait);
            Assert.IsFalse(info.Held);
            Assert.AreEqual(2816, (long)info.LockDelayLeft.TotalMilliseconds);

            const string why = "the server is in its start-up wait: no grant for 2500 ms more (leases granted before its restart may still run)";
            Task<TicketingLock> f = c.AcquireAsync("k", TimeSpan.FromSeconds(1), TimeSpan.FromMilliseconds(300));
            FakeServer.Received a = _server.Expect(Op.Acquire);
            a.Conn.Reply(a.Frame, Status.TimedOut, 0, 0, 0, Encoding.UTF8.GetBytes(why));
            var e = Tasks.Failure<NotAcquiredException>(f);
            StringAssert.Contains(why, e.Message);
            StringAssert.DoesNotContain("held by another token", e.Message);
        }

        [Test]
        public void CloseWithdrawsQueuedAcquires()
        {
            TicketingClient c = Connect();
            Task<TicketingLock> f = c.AcquireAsync("k", TimeSpan.FromSeconds(5));
            FakeServer.Received a = _server.Expect(Op.Acquire);
            Task closing = c.CloseAsync();
            FakeServer.Received cancel = _server.Expect(Op.Cancel);
            Assert.AreEqual(a.Id, cancel.Frame.Token);
            Tasks.Failure<ClosedException>(f);
            a.Conn.Reply(a.Frame, Status.Cancelled);
            cancel.Conn.Reply(cancel.Frame, Status.Ok, 0, 0, 1);
            Tasks.Ok(closing);
        }
    }
}
