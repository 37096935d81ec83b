using System;
using System.Collections.Concurrent;
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
    /// <summary>The client's protocol behaviour against a scripted server (PROTOCOL.md, docs/clients.md).</summary>
    [TestFixture]
    [Timeout(30000)]
    public partial class FakeServerTests : TestBase
    {
        private FakeServer _server;

        [SetUp]
        public void StartServer()
        {
            _server = Closing(new FakeServer());
        }

        private TicketingClient Connect(Action<TicketingOptions> tweak = null)
        {
            var o = new TicketingOptions
            {
                Endpoints = new List<string> { _server.Endpoint },
                ReconnectBackoffMin = TimeSpan.FromMilliseconds(10),
                ReconnectBackoffMax = TimeSpan.FromMilliseconds(100),
                CleanupTimeout = TimeSpan.FromMilliseconds(300),
            };
            tweak?.Invoke(o);
            return Closing(Tasks.Result(TicketingClient.ConnectAsync(o)));
        }

        private static byte[] Bytes(string s)
        {
            return Encoding.UTF8.GetBytes(s);
        }

        private static void Grant(FakeServer.Received r, ulong token, uint detail = 0)
        {
            r.Conn.Reply(r.Frame, Status.Ok, token, r.Frame.LeaseMs, detail);
        }

        private TicketingLock Held(TicketingClient c, string key, ulong token, AcquireOptions options = null)
        {
            Task<TicketingLock> f = c.AcquireAsync(key, options ?? new AcquireOptions(TimeSpan.FromSeconds(30)));
            Grant(_server.Expect(Op.Acquire), token);
            return Tasks.Result(f);
        }

        // ---- handshake ----

        [Test]
        public void SessionIdIsRandomNonZeroAndTheSameOnEveryConnection()
        {
            TicketingClient c = Connect();
            string sid = c.SessionId;
            Assert.AreEqual(32, sid.Length);
            Assert.AreNotEqual(new string('0', 32), sid);
            Assert.AreNotEqual(sid, Connect().SessionId);
            _server.KillAll();
            Poll.Until(TimeSpan.FromSeconds(5), () => _server.Hellos.Count(h => h == sid) == 2, "the same session id on the reconnect");
        }

        [Test]
        public void TokenAuthVerifiesBothProofs()
        {
            _server.Token = Bytes("s3cret");
            TicketingClient c = Connect(o => o.Token = "s3cret");
            Assert.GreaterOrEqual(Tasks.Result(c.PingAsync()), TimeSpan.Zero);

            var wrong = Assert.Throws<AuthFailedException>(() => Connect(o => o.Token = "nope"));
            StringAssert.Contains("rejected the token", wrong.Message);
            var none = Assert.Throws<AuthFailedException>(() => Connect());
            StringAssert.Contains("requires a token", none.Message);

            _server.ForgeServerProof = true;
            var forged = Assert.Throws<AuthFailedException>(() => Connect(o => o.Token = "s3cret"));
            StringAssert.Contains("could not prove", forged.Message);
        }

        [Test]
        public void ClientWithTokenRefusesServerWithoutAuth()
        {
            var e = Assert.Throws<AuthFailedException>(() => Connect(o => o.Token = "t"));
            StringAssert.Contains("does not require a token", e.Message);
        }

        [Test]
        public void ChallengeNotLeaderFollowsTheHint()
        {
            var leader = Closing(new FakeServer());
            _server.NotLeaderHint = leader.Endpoint;
            TicketingClient c = Connect();
            Task<TicketingLock> f = c.AcquireAsync("k", TimeSpan.FromSeconds(5));
            Grant(leader.Expect(Op.Acquire), 3);
            Assert.AreEqual(3UL, Tasks.Result(f).Token);
        }

        [Test]
        public void FirstConnectWaitsOutALeaderElection()
        {
            _server.NotLeaderNext = 2; // "not leader, and knows none" twice (a cluster electing), then a leader
            TicketingClient c = Connect(o => o.ReconnectBackoffMin = TimeSpan.FromMilliseconds(50));
            Tasks.Result(c.PingAsync());
            Assert.AreEqual(3, _server.Hellos.Count, "asked again after each refusal");
            Assert.AreEqual(1, _server.Hellos.Distinct().Count(), "one session throughout");
        }

        [Test]
        public void FirstConnectDuringAnElectionGivesUpAfterTheRequestTimeout()
        {
            _server.NotLeaderHint = ""; // an election that never ends
            var sw = Stopwatch.StartNew();
            var e = Assert.Throws<UnavailableException>(() => Connect(o => o.RequestTimeout = TimeSpan.FromMilliseconds(500)));
            StringAssert.Contains("not the leader", e.Message);
            Assert.That(sw.ElapsedMilliseconds, Is.InRange(400, 2500), "gives up after about the request timeout");
            Assert.GreaterOrEqual(_server.Hellos.Count, 3, "kept trying meanwhile");
        }

        [Test]
        public void FirstConnectDuringAnElectionEndsWhenCancelled()
        {
            _server.NotLeaderHint = "";
            using (var cts = new CancellationTokenSource())
            {
                Task<TicketingClient> t = TicketingClient.ConnectAsync(new TicketingOptions
                {
                    Endpoints = new List<string> { _server.Endpoint },
                    ReconnectBackoffMin = TimeSpan.FromMilliseconds(50),
                }, cts.Token);
                Poll.Until(TimeSpan.FromSeconds(5), () => _server.Hellos.Count >= 2, "a second round");
                cts.Cancel();
                Tasks.Failure<OperationCanceledException>(t);
                int rounds = _server.Hellos.Count;
                Thread.Sleep(300);
                Assert.AreEqual(rounds, _server.Hellos.Count, "still connecting after the cancel");
            }
        }

        [Test]
        public void UnreachableEndpointIsUnavailable()
        {
            int port = _server.Port;
            _server.Dispose();
            var sw = Stopwatch.StartNew();
            var e = Assert.Throws<UnavailableException>(() => Tasks.Result(TicketingClient.ConnectAsync(new TicketingOptions
            {
                Endpoints = new List<string> { "127.0.0.1:" + port },
                ConnectTimeout = TimeSpan.FromSeconds(1),
            })));
            StringAssert.Contains("127.0.0.1:" + port, e.Message);
            Assert.Less(sw.ElapsedMilliseconds, 3000);
        }

        [Test]
        public void SilentServerTimesOutTheHandshake()
        {
            _server.Frozen = true;
            var sw = Stopwatch.StartNew();
            var e = Assert.Throws<UnavailableException>(() => Connect(o => o.ConnectTimeout = TimeSpan.FromMilliseconds(300)));
            StringAssert.Contains("timed out", e.Message);
            Assert.That(sw.ElapsedMilliseconds, Is.InRange(250, 3000));
        }

        [Test]
        public void ConnectIsCancelledByItsToken()
        {
            _server.Frozen = true;
            using (var cts = new CancellationTokenSource(200))
            {
                Task<TicketingClient> t = TicketingClient.ConnectAsync(new TicketingOptions { Endpoints = new List<string> { _server.Endpoint } }, cts.Token);
                Tasks.Failure<OperationCanceledException>(t);
            }
        }

        [Test]
        public void EndpointsAreTriedInOrder()
        {
            var dead = new FakeServer();
            string deadEndpoint = dead.Endpoint;
            dead.Dispose();
            TicketingClient c = Connect(o => o.Endpoints = new List<string> { deadEndpoint, _server.Endpoint });
            Tasks.Result(c.PingAsync());
        }

        // ---- requests ----

        [Test]
        public void RequestIdsStartAtOneAndFollowSendOrder()
        {
            _server.AutoPing = false;
            TicketingClient c = Connect(o => o.HeartbeatInterval = TimeSpan.Zero);
            var pings = Enumerable.Range(0, 5).Select(i => c.PingAsync()).ToList();
            var got = new List<FakeServer.Received>();
            for (int i = 0; i < 5; i++)
            {
                got.Add(_server.Expect(Op.Ping));
                Assert.AreEqual((ulong)(i + 1), got[i].Id);
            }
            for (int i = 4; i >= 0; i--)
            {
                got[i].Conn.Ok(got[i].Frame); // answers in reverse order are matched by id
            }
            foreach (var p in pings)
            {
                Tasks.Result(p);
            }
        }

        [Test]
        public void ManyConcurrentTasksGetTheirOwnAnswers()
        {
            _server.AutoPing = false;
            TicketingClient c = Connect(o => o.HeartbeatInterval = TimeSpan.Zero);
            const int n = 200;
            var calls = Enumerable.Range(0, n).Select(i => Task.Run(() => c.InspectAsync("k" + i))).ToList();
            var got = new List<FakeServer.Received>();
            for (int i = 0; i < n; i++)
            {
                got.Add(_server.Expect(Op.Inspect));
            }
            CollectionAssert.AreEqual(Enumerable.Range(1, n).Select(i => (ulong)i), got.Select(r => r.Id), "ids reach the wire in order");
            var rnd = new Random(7);
            foreach (var r in got.OrderBy(x => rnd.Next()))
            {
                // each answer carries its key's number as the waiter count
                uint k = uint.Parse(Encoding.UTF8.GetString(r.Frame.Key).Substring(1));
                r.Conn.Reply(r.Frame, Status.Ok, 0, 0, k, new byte[12]);
            }
            for (int i = 0; i < n; i++)
            {
                Assert.AreEqual((long)i, Tasks.Result(calls[i]).Waiters);
            }
        }

        [Test]
        public void AcquireFieldsAndLocalDeadline()
        {
            TicketingClient c = Connect();
            var sw = Stopwatch.StartNew();
            Task<TicketingLock> f = c.AcquireAsync("order-1234", TimeSpan.FromMilliseconds(300), TimeSpan.FromSeconds(5));
            FakeServer.Received r = _server.Expect(Op.Acquire);
            CollectionAssert.AreEqual(Bytes("order-1234"), r.Frame.Key);
            Assert.AreEqual(300u, r.Frame.LeaseMs);
            Assert.AreEqual(5000u, r.Frame.WaitMs);
            Assert.AreEqual(0, r.Frame.Flags);
            r.Conn.Reply(r.Frame, Status.Ok, 7, 300, 100); // granted after 100 ms in the queue
            TicketingLock l = Tasks.Result(f);
            Assert.AreEqual(7UL, l.Token);
            Assert.AreEqual("order-1234", l.Key);
            Assert.AreEqual(TimeSpan.FromMilliseconds(300), l.Lease);
            Assert.AreEqual(LostReason.Expired, Tasks.Result(l.Lost));
            Assert.IsTrue(l.HandleLostToken.IsCancellationRequested);
            long ms = sw.ElapsedMilliseconds;
            // deadline = t_send + (100 + 300) * 0.998 ms, fired 5 ms early
            Assert.That(ms, Is.InRange(390, 2000), "lost after " + ms + " ms");
            Task rel = l.ReleaseAsync();
            FakeServer.Received told = _server.Expect(Op.Release); // the server is told anyway
            told.Conn.Reply(told.Frame, Status.NotHeld);
            Assert.AreEqual(LostReason.Expired, Tasks.Failure<LockLostException>(rel).Reason);
        }

        [Test]
        public void WaitForeverAndTryOnceOnTheWire()
        {
            TicketingClient c = Connect();
            c.AcquireAsync("a", TimeSpan.FromSeconds(1));
            Assert.AreEqual(Wire.WaitForever, _server.Expect(Op.Acquire).Frame.WaitMs);
            c.AcquireAsync("a", TimeSpan.FromSeconds(1), Timeout.InfiniteTimeSpan);
            Assert.AreEqual(Wire.WaitForever, _server.Expect(Op.Acquire).Frame.WaitMs);
            Task<TicketingLock> t = c.TryAcquireAsync("b", TimeSpan.FromSeconds(1));
            FakeServer.Received r = _server.Expect(Op.Acquire);
            Assert.AreEqual(0u, r.Frame.WaitMs);
            r.Conn.Reply(r.Frame, Status.TimedOut);
            Assert.IsNull(Tasks.Result(t), "not acquired is null, not an exception");
            Task<TicketingLock> plain = c.AcquireAsync("b", TimeSpan.FromSeconds(1), TimeSpan.Zero);
            r = _server.Expect(Op.Acquire);
            Assert.AreEqual(0u, r.Frame.WaitMs);
            r.Conn.Reply(r.Frame, Status.TimedOut);
            StringAssert.Contains("\"b\"", Tasks.Failure<NotAcquiredException>(plain).Message);
        }

        [Test]
        public void StatusesMapToExceptions()
        {
            TicketingClient c = Connect();
            var cases = new List<Tuple<Status, uint, Type>>
            {
                Tuple.Create(Status.TimedOut, 0u, typeof(NotAcquiredException)),
                Tuple.Create(Status.Invalid, 5u, typeof(InvalidRequestException)),
                Tuple.Create(Status.Busy, 2u, typeof(BusyException)),
                Tuple.Create(Status.ShuttingDown, 0u, typeof(ShuttingDownException)),
                Tuple.Create((Status)77, 0u, typeof(ProtocolException)),
            };
            foreach (var k in cases)
            {
                Task<TicketingLock> f = c.AcquireAsync("k", TimeSpan.FromSeconds(1), TimeSpan.FromSeconds(1));
                FakeServer.Received r = _server.Expect(Op.Acquire);
                r.Conn.Reply(r.Frame, k.Item1, 0, 0, k.Item2, Bytes("why"));
                Exception e = Tasks.Failure<Exception>(f);
                Assert.IsInstanceOf(k.Item3, e);
                Assert.IsInstanceOf<TicketingException>(e);
                StringAssert.Contains("\"k\"", e.Message);
            }
            Task<TicketingLock> last = c.AcquireAsync("k", TimeSpan.FromSeconds(1), TimeSpan.FromSeconds(1));
            FakeServer.Received lr = _server.Expect(Op.Acquire);
            lr.Conn.Reply(lr.Frame, Status.Invalid, 0, 0, 5, Bytes("lease out of range"));
            var invalid = Tasks.Failure<InvalidRequestException>(last);
            Assert.AreEqual(InvalidField.Lease, invalid.Field);
            StringAssert.Contains("LEASE", invalid.Message);
            StringAssert.Contains("lease out of range", invalid.Message);

            Task rel = c.ReleaseAsync("k", 9);
            FakeServer.Received rr = _server.Expect(Op.Release);
            rr.Conn.Reply(rr.Frame, Status.Busy, 0, 0, 5);
            Assert.AreEqual(BusyLimit.Inflight, Tasks.Failure<BusyException>(rel).Limit);
            Task notHeld = c.ReleaseAsync("k", 9);
            rr = _server.Expect(Op.Release);
            rr.Conn.Reply(rr.Frame, Status.NotHeld);
            StringAssert.Contains("token 9", Tasks.Failure<NotHeldException>(notHeld).Message);
        }

        [Test]
        public void BadArgumentsAreRejectedBeforeAnythingIsSent()
        {
            TicketingClient c = Connect();
            TimeSpan s1 = TimeSpan.FromSeconds(1);
            Assert.Throws<ArgumentException>(() => c.AcquireAsync("", s1));
            Assert.Throws<ArgumentNullException>(() => c.AcquireAsync((string)null, s1));
            Assert.Throws<ArgumentNullException>(() => c.AcquireAsync((byte[])null, new AcquireOptions(s1)));
            Assert.Throws<ArgumentException>(() => c.AcquireAsync(new byte[0], new AcquireOptions(s1)));
            Assert.Throws<ArgumentException>(() => c.AcquireAsync(new string('k', 65536), s1));
            Assert.Throws<ArgumentException>(() => c.AcquireAsync(new byte[65536], new AcquireOptions(s1)));
            Assert.Throws<ArgumentException>(() => c.AcquireAsync("\ud800", s1), "a lone surrogate is not a key");
            var lease = Assert.Throws<ArgumentOutOfRangeException>(() => c.AcquireAsync("k", TimeSpan.Zero));
            StringAssert.Contains("1 ms", lease.Message);
            Assert.Throws<ArgumentOutOfRangeException>(() => c.AcquireAsync("k", TimeSpan.FromMilliseconds(-5)));
            Assert.Throws<ArgumentOutOfRangeException>(() => c.AcquireAsync("k", TimeSpan.FromTicks(9999)));
            Assert.Throws<ArgumentOutOfRangeException>(() => c.AcquireAsync("k", TimeSpan.FromMilliseconds(1L << 32)));
            Assert.Throws<ArgumentOutOfRangeException>(() => c.AcquireAsync("k", s1, TimeSpan.FromMilliseconds(-5)));
            Assert.Throws<ArgumentNullException>(() => c.AcquireAsync("k", (AcquireOptions)null));
            Assert.Throws<ArgumentOutOfRangeException>(() => c.ReleaseAsync("k", 0));
            Assert.Throws<ArgumentOutOfRangeException>(() => c.ExtendAsync("k", 5, TimeSpan.Zero));
            Assert.Throws<ArgumentException>(() => c.InspectAsync(""));
            Assert.Throws<ArgumentException>(() => Tasks.Result(TicketingClient.ConnectAsync(new TicketingOptions { Endpoints = new List<string> { "nohost" } })));
            Assert.Throws<ArgumentException>(() => Tasks.Result(TicketingClient.ConnectAsync(new TicketingOptions { Endpoints = new List<string> { "h:70000" } })));
            Assert.Throws<ArgumentOutOfRangeException>(() => Tasks.Result(TicketingClient.ConnectAsync(new TicketingOptions { RequestTimeout = TimeSpan.Zero })));
            Assert.IsNull(_server.Poll(200), "nothing reaches the server");
        }

        [Test]
        public void PushesExpiredAndUnknownOps()
        {
            TicketingClient c = Connect();
            Task<TicketingLock> f1 = c.AcquireAsync("a", TimeSpan.FromSeconds(30));
            FakeServer.Received r1 = _server.Expect(Op.Acquire);
            Grant(r1, 11);
            TicketingLock a = Tasks.Result(f1);
            TicketingLock b = Held(c, "b", 12);
            int calls = 0;
            a.HandleLostToken.Register(() => Interlocked.Increment(ref calls));

            r1.Conn.Send(new ResponseFrame((Op)0x2f, Status.Ok, 0, 0, 0, 0, null)); // unknown push: ignored
            // EXPIRED for the right token but another key changes nothing
            r1.Conn.Send(new ResponseFrame(Op.Expired, Status.Ok, 0, 11, 0, (uint)ExpiredReason.Lease, Bytes("zzz")));
            r1.Conn.Send(new ResponseFrame(Op.Expired, Status.Ok, 0, 11, 0, (uint)ExpiredReason.Lease, Bytes("a")));
            r1.Conn.Send(new ResponseFrame(Op.Expired, Status.Ok, 0, 11, 0, (uint)ExpiredReason.Lease, Bytes("a")));
            r1.Conn.Send(new ResponseFrame(Op.Expired, Status.Ok, 0, 12, 0, (uint)ExpiredReason.Stopping, Bytes("b")));
            Assert.AreEqual(LostReason.Expired, Tasks.Result(a.Lost));
            Assert.AreEqual(LostReason.ServerStopping, Tasks.Result(b.Lost));
            Poll.Until(TimeSpan.FromSeconds(2), () => Volatile.Read(ref calls) == 1, "the lost callback");
            Thread.Sleep(50);
            Assert.AreEqual(1, Volatile.Read(ref calls), "lost fires once");
            Tasks.Result(c.PingAsync()); // the connection survived the unknown push
        }

        [Test]
        public void UnknownExpiredReasonCountsAsExpired()
        {
            TicketingClient c = Connect();
            Task<TicketingLock> f = c.AcquireAsync("a", TimeSpan.FromSeconds(30));
            FakeServer.Received r = _server.Expect(Op.Acquire);
            Grant(r, 4);
            TicketingLock l = Tasks.Result(f);
            r.Conn.Send(new ResponseFrame(Op.Expired, Status.Ok, 0, 4, 0, 99, Bytes("a")));
            Assert.AreEqual(LostReason.Expired, Tasks.Result(l.Lost));
        }

        // ---- cancellation ----

        [Test]
        public void CancelledAcquireIsWithdrawn()
        {
            TicketingClient c = Connect(o => o.CleanupTimeout = TimeSpan.FromSeconds(5));
            var cts = new CancellationTokenSource();
            Task<TicketingLock> f = c.AcquireAsync("k", TimeSpan.FromSeconds(5), null, cts.Token);
            FakeServer.Received acq = _server.Expect(Op.Acquire);
            cts.Cancel();
            FakeServer.Received cancel = _server.Expect(Op.Cancel);
            Assert.AreEqual(acq.Id, cancel.Frame.Token);
            Thread.Sleep(100);
            Assert.IsFalse(f.IsCompleted, "the acquire waits (bounded) for its withdrawal");
            acq.Conn.Reply(acq.Frame, Status.Cancelled);
            cancel.Conn.Reply(cancel.Frame, Status.Ok, 0, 0, 1);
            var e = Tasks.Failure<OperationCanceledException>(f);
            Assert.AreEqual(cts.Token, e.CancellationToken);
            Assert.IsTrue(f.IsCanceled, "the task is Canceled, as .NET expects");
            Assert.IsNull(_server.Poll(300), "no release for a withdrawn wait");
        }

        [Test]
        public void AlreadyCancelledTokenSendsNothing()
        {
            TicketingClient c = Connect();
            var f = c.AcquireAsync("k", TimeSpan.FromSeconds(5), null, new CancellationToken(true));
            Tasks.Failure<OperationCanceledException>(f);
            Assert.IsNull(_server.Poll(200));
        }

        [Test]
        public void GrantRacingACancelIsReleased()
        {
            TicketingClient c = Connect();
            var cts = new CancellationTokenSource();
            Task<TicketingLock> f = c.AcquireAsync("k", TimeSpan.FromSeconds(5), null, cts.Token);
            FakeServer.Received acq = _server.Expect(Op.Acquire);
            cts.Cancel();
            FakeServer.Received cancel = _server.Expect(Op.Cancel);
            Grant(acq, 41); // the grant crossed the CANCEL
            cancel.Conn.Reply(cancel.Frame, Status.Ok);
            FakeServer.Received rel = _server.Expect(Op.Release);
            Assert.AreEqual(41UL, rel.Frame.Token);
            CollectionAssert.AreEqual(Bytes("k"), rel.Frame.Key);
            rel.Conn.Ok(rel.Frame);
            Tasks.Failure<OperationCanceledException>(f);
        }

        [Test]
        public void CancelAfterTheGrantKeepsTheLock()
        {
            TicketingClient c = Connect();
            var cts = new CancellationTokenSource();
            Task<TicketingLock> f = c.AcquireAsync("k", TimeSpan.FromSeconds(5), null, cts.Token);
            Grant(_server.Expect(Op.Acquire), 8);
            TicketingLock l = Tasks.Result(f);
            cts.Cancel();
            Assert.IsNull(_server.Poll(200), "a cancel after the grant sends nothing");
            Assert.IsFalse(l.IsLost);
        }

        [Test]
        public void AcquireWhoseConnectionDiedIsWithdrawnOnTheNextConnection()
        {
            TicketingClient c = Connect(o =>
            {
                o.CleanupTimeout = TimeSpan.FromSeconds(5);
                o.ConnectTimeout = TimeSpan.FromMilliseconds(300);
            });
            var cts = new CancellationTokenSource();
            Task<TicketingLock> f = c.AcquireAsync("k", TimeSpan.FromSeconds(5), null, cts.Token);
            FakeServer.Received acq = _server.Expect(Op.Acquire);
            _server.Frozen = true; // the reconnect cannot finish for now
            acq.Conn.Kill();
            Poll.Until(TimeSpan.FromSeconds(5), () => _server.Hellos.Count >= 2, "a reconnect attempt");
            cts.Cancel();
            _server.Frozen = false;
            FakeServer.Received retry = _server.Expect(Op.Acquire);
            Assert.AreEqual(acq.Id, retry.Id, "the unanswered acquire is re-sent first");
            FakeServer.Received cancel = _server.Expect(Op.Cancel);
            Assert.AreEqual(acq.Id, cancel.Frame.Token);
            retry.Conn.Reply(retry.Frame, Status.Cancelled);
            cancel.Conn.Reply(cancel.Frame, Status.Ok, 0, 0, 1);
            Tasks.Failure<OperationCanceledException>(f);
        }

        // ---- timeouts and heartbeat ----

        [Test]
        public void RequestTimeoutAndAcquireQueueTimeIsExcluded()
        {
            TicketingClient quiet = Connect(o =>
            {
                o.RequestTimeout = TimeSpan.FromMilliseconds(300);
                o.HeartbeatInterval = TimeSpan.Zero;
            });
            _server.AutoPing = false;
            var sw = Stopwatch.StartNew();
            Task<TimeSpan> ping = quiet.PingAsync();
            _server.Expect(Op.Ping); // never answered
            var e = Tasks.Failure<RequestTimeoutException>(ping);
            StringAssert.Contains("300", e.Message);
            Assert.GreaterOrEqual(sw.ElapsedMilliseconds, 290);
            _server.AutoPing = true;
            TicketingClient c = Connect(o =>
            {
                o.RequestTimeout = TimeSpan.FromMilliseconds(300);
                // A PING unanswered within the heartbeat fails the connection (docs/clients.md):
                // 300 ms, not less, so that a busy machine's slow fake server does not make the
                // client leave a healthy connection (its queued acquire would then be re-sent).
                o.HeartbeatInterval = TimeSpan.FromMilliseconds(300);
            });

            // an acquire queued for 3 request timeouts is not timed out (the heartbeat keeps the link checked)
            Task<TicketingLock> f = c.AcquireAsync("k", TimeSpan.FromSeconds(5));
            FakeServer.Received acq = _server.Expect(Op.Acquire);
            Thread.Sleep(900);
            Assert.IsFalse(f.IsCompleted);
            Grant(acq, 5);
            Assert.AreEqual(5UL, Tasks.Result(f).Token);

            // a wait timeout is bounded by wait + request timeout
            sw.Restart();
            Task<TicketingLock> bounded = c.AcquireAsync("k2", TimeSpan.FromSeconds(5), TimeSpan.FromMilliseconds(200));
            FakeServer.Received never = _server.Expect(Op.Acquire);
            Tasks.Failure<RequestTimeoutException>(bounded);
            Assert.That(sw.ElapsedMilliseconds, Is.InRange(480, 3000));
            Assert.AreEqual(Op.Cancel, _server.Expect(Op.Cancel).Op, "the timed-out acquire is withdrawn");
            Assert.IsNotNull(never);
        }

        [Test]
        public void HeartbeatDetectsAFrozenServerAndTheClientReconnects()
        {
            TicketingClient c = Connect(o =>
            {
                o.RequestTimeout = TimeSpan.FromMilliseconds(300);
                o.HeartbeatInterval = TimeSpan.FromMilliseconds(100);
            });
            _server.AutoPing = false;
            FakeServer.Received ping = _server.Expect(Op.Ping); // the heartbeat
            Assert.AreEqual(1UL, ping.Id);
            _server.AutoPing = true;
            // unanswered: after the request timeout the connection is replaced, the session resumed
            _server.NextConnection();
            FakeServer.Conn second = _server.NextConnection();
            Assert.IsTrue(second.Resumed);
            Tasks.Result(c.PingAsync());
        }

        [Test]
        public void CloseReturnsPromptlyWhenTheServerIsFrozen()
        {
            TicketingClient c = Connect(o =>
            {
                o.RequestTimeout = TimeSpan.FromMilliseconds(500);
                o.HeartbeatInterval = TimeSpan.FromMilliseconds(200);
            });
            Task<TicketingLock> f = c.AcquireAsync("k", TimeSpan.FromSeconds(5));
            _server.Expect(Op.Acquire);
            _server.Frozen = true;
            var sw = Stopwatch.StartNew();
            c.Dispose();
            Assert.Less(sw.ElapsedMilliseconds, 3000);
            Tasks.Failure<ClosedException>(f);
            Assert.IsTrue(c.IsClosed);
            Tasks.Failure<ClosedException>(c.PingAsync());
        }
    }
}
