using System;
using System.Collections.Concurrent;
using System.Collections.Generic;
using System.Diagnostics;
using System.IO;
using System.Linq;
using System.Net;
using System.Net.Security;
using System.Net.Sockets;
using System.Security.Authentication;
using System.Security.Cryptography.X509Certificates;
using System.Text;
using System.Threading;
using System.Threading.Tasks;
using NUnit.Framework;
using Ticketing.Protocol;

namespace Ticketing.Tests
{
    /// <summary>Sessions, ACK and lock handles against the scripted server (the other half of <see cref="FakeServerTests"/>).</summary>
    public partial class FakeServerTests
    {
        // ---- sessions ----

        [Test]
        public void ResumedSessionResendsUnansweredRequestsWithTheirIdsBeforeNewOnes()
        {
            TicketingClient c = Connect();
            Task<TicketingLock> f = c.AcquireAsync("k", TimeSpan.FromSeconds(5));
            FakeServer.Received first = _server.Expect(Op.Acquire);
            var sinceArrival = Stopwatch.StartNew();
            Task<LockInfo> insp = c.InspectAsync("other");
            FakeServer.Received second = _server.Expect(Op.Inspect);
            first.Conn.Kill();
            FakeServer.Received retry1 = _server.Expect(Op.Acquire);
            FakeServer.Received retry2 = _server.Expect(Op.Inspect);
            Assert.IsTrue(retry1.Conn.Resumed);
            Assert.AreEqual(first.Id, retry1.Id);
            Assert.AreEqual(second.Id, retry2.Id);
            CollectionAssert.AreEqual(first.Frame.Key, retry1.Frame.Key);
            Assert.AreEqual(first.Frame.LeaseMs, retry1.Frame.LeaseMs);
            Assert.AreEqual(first.Frame.WaitMs, retry1.Frame.WaitMs);
            Task<TimeSpan> later = c.PingAsync();
            Tasks.Result(later);
            // A retried ACQUIRE answered from the table: lease_ms is the time left, detail the time
            // since the request first arrived.
            retry1.Conn.Reply(retry1.Frame, Status.Ok, 9, 2000, (uint)sinceArrival.ElapsedMilliseconds);
            retry2.Conn.Send(new ResponseFrame(Op.Inspect, Status.Ok, retry2.Id, 0, 0, 0, new byte[12]));
            TicketingLock l = Tasks.Result(f);
            Assert.AreEqual(9UL, l.Token);
            Assert.That(l.TimeLeft.TotalMilliseconds, Is.InRange(1500, 2000));
            Assert.IsFalse(Tasks.Result(insp).Held);
        }

        [Test]
        public void EndedSessionFailsUnansweredRequestsAndKeepsLocks()
        {
            TicketingClient c = Connect();
            TicketingLock held = Held(c, "held", 3);
            Task<TicketingLock> f2 = c.AcquireAsync("waiting", TimeSpan.FromSeconds(30));
            FakeServer.Received w = _server.Expect(Op.Acquire);
            _server.Resume = false;
            w.Conn.Kill();
            Tasks.Failure<ConnectionLostException>(f2);
            Assert.IsFalse(held.IsLost);
            Tasks.Result(c.PingAsync());
        }

        [Test]
        public void DifferentStateIdLosesEveryLockAndStartsANewSession()
        {
            TicketingClient c = Connect();
            string oldSession = c.SessionId;
            TicketingLock held = Held(c, "held", 3);
            Task<TicketingLock> f2 = c.AcquireAsync("waiting", TimeSpan.FromSeconds(30));
            FakeServer.Received w = _server.Expect(Op.Acquire);
            _server.NewStateId();
            w.Conn.Kill();
            Assert.AreEqual(LostReason.ServerRestarted, Tasks.Result(held.Lost));
            Assert.AreEqual(LostReason.ServerRestarted, held.LostReason);
            Tasks.Failure<ServerRestartedException>(f2);
            Assert.IsNull(_server.Poll(300), "the waiter is not re-queued");
            Tasks.Result(c.PingAsync());
            Assert.AreNotEqual(oldSession, c.SessionId);
            Assert.AreEqual(c.SessionId, _server.Hellos.Last());
            // A lock lost to a restart: its release answers at once and sends nothing (the new
            // server has nothing of the old state to release).
            Task rel = held.ReleaseAsync();
            Assert.IsTrue(rel.IsCompleted);
            Assert.AreEqual(LostReason.ServerRestarted, Tasks.Failure<LockLostException>(rel).Reason);
            Assert.IsNull(_server.Poll(200), "nothing is released on the new server");
            Task<LockInfo> insp = c.InspectAsync("k");
            FakeServer.Received next = _server.Expect(Op.Inspect);
            Assert.AreEqual(2UL, next.Id, "request ids start again at 1 in the new session (1 was the ping)");
            next.Conn.Send(new ResponseFrame(Op.Inspect, Status.Ok, next.Id, 0, 0, 0, new byte[12]));
            Tasks.Result(insp);
        }

        [Test]
        public void GraceOverFailsAwaitedRequests()
        {
            _server.GraceMs = 300;
            TicketingClient c = Connect(o => o.RequestTimeout = TimeSpan.FromSeconds(20));
            Task rel = c.ReleaseAsync("k", 5);
            FakeServer.Received r = _server.Expect(Op.Release);
            _server.Dispose(); // nobody to reconnect to
            var sw = Stopwatch.StartNew();
            Tasks.Failure<ConnectionLostException>(rel);
            Assert.Less(sw.ElapsedMilliseconds, 5000);
            Assert.AreEqual(Op.Release, r.Op);
        }

        // ---- reconnecting ----

        [Test]
        public void FailedReconnectRoundsDoNotFailWaitingCallsUnlessNoRetryFixesThem()
        {
            TicketingClient c = Connect(o =>
            {
                o.RequestTimeout = TimeSpan.FromSeconds(5);
                o.HeartbeatInterval = TimeSpan.Zero;
            });
            _server.NextConnection(); // (so that KillAll finds it)
            _server.Refuse = (int)Status.Busy; // every round fails, as at a node at its connection limit
            _server.KillAll();
            Task<TimeSpan> ping = c.PingAsync();
            Thread.Sleep(500);
            Assert.IsFalse(ping.IsCompleted, "a failed reconnect round failed a waiting call: " + ping.Status + " " + ping.Exception);
            _server.Refuse = -1;
            Tasks.Result(ping);
            // An error no retry fixes fails every waiting call at once.
            _server.Refuse = (int)Status.UnsupportedVersion;
            _server.KillAll();
            var sw = Stopwatch.StartNew();
            Tasks.Failure<UnsupportedVersionException>(c.PingAsync());
            Assert.Less(sw.ElapsedMilliseconds, 3000);
        }

        [Test]
        public void AfterARoundWithNotLeaderTheNextPauseIsTheShortest()
        {
            var follower = Closing(new FakeServer());
            follower.StateId = _server.StateId;
            follower.NotLeaderHint = ""; // electing: it knows no leader yet
            TicketingClient c = Connect(o =>
            {
                o.Endpoints = new List<string> { _server.Endpoint, follower.Endpoint };
                o.ReconnectBackoffMin = TimeSpan.FromMilliseconds(50);
                o.ReconnectBackoffMax = TimeSpan.FromSeconds(2);
            });
            TicketingLock l = Held(c, "k", 7);
            _server.Dispose(); // refused from now on
            Poll.Until(TimeSpan.FromSeconds(5), () => follower.Hellos.Count > 0, "a reconnect round");
            int before = follower.Hellos.Count;
            Thread.Sleep(2000);
            int rounds = follower.Hellos.Count - before;
            // Pauses of 25-50 ms: about 40-80 rounds in 2 s; doubling (50, 100, 200, 400, 800,
            // 1600 ms, with jitter) would give at most 7. (Over 1 s a loaded machine fell short.)
            Assert.GreaterOrEqual(rounds, 12, rounds + " rounds in 2 s: the backoff grew during the election");
            Assert.IsFalse(l.IsLost);
        }

        [Test]
        public void ACallTimingOutWhileReconnectingNamesTheLastConnectError()
        {
            TicketingClient c = Connect(o =>
            {
                // Long enough for a loaded machine to notice the drop (a RST) before it passes.
                o.RequestTimeout = TimeSpan.FromMilliseconds(1500);
                o.HeartbeatInterval = TimeSpan.Zero;
            });
            _server.AutoPing = false;
            Task sent = c.PingAsync();
            _server.Expect(Op.Ping); // never answered
            string endpoint = _server.Endpoint;
            _server.Dispose(); // refused from now on
            var e = Tasks.Failure<RequestTimeoutException>(sent);
            StringAssert.Contains("not connected, last connect error: ", e.Message);
            StringAssert.Contains(endpoint, e.Message);
            Assert.IsInstanceOf<UnavailableException>(e.InnerException);
            // A call made while reconnecting: the same.
            e = Tasks.Failure<RequestTimeoutException>(c.AcquireAsync("k", TimeSpan.FromSeconds(5)));
            StringAssert.Contains("last connect error: ", e.Message);
            Assert.IsInstanceOf<UnavailableException>(e.InnerException);
        }

        [Test]
        public void ClosedDuringTheHandshakeAfterTlsIsUnavailable()
        {
            string d = Path.Combine(Path.GetTempPath(), "ticketing-csharp-rsa-" + Guid.NewGuid().ToString("N"));
            Directory.CreateDirectory(d);
            var listener = new TcpListener(IPAddress.Loopback, 0);
            try
            {
                // An RSA certificate: the test's TLS server is Mono's own.
                File.WriteAllText(Path.Combine(d, "server.ext"), "subjectAltName=IP:127.0.0.1\n");
                Certs.Run(d, "req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 2 -subj /CN=ticketing-test-ca");
                Certs.Run(d, "req -newkey rsa:2048 -nodes -keyout server.key -out server.csr -subj /CN=server");
                Certs.Run(d, "x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out server.pem -days 2 -extfile server.ext");
                Certs.Run(d, "pkcs12 -export -in server.pem -inkey server.key -out server.pfx -passout pass:x"
                    + " -keypbe PBE-SHA1-3DES -certpbe PBE-SHA1-3DES -macalg sha1");
                var cert = new X509Certificate2(Path.Combine(d, "server.pfx"), "x");
                listener.Start();
                var server = new Thread(() =>
                {
                    try
                    {
                        using (TcpClient tc = listener.AcceptTcpClient())
                        using (var ssl = new SslStream(tc.GetStream(), false))
                        {
                            ssl.AuthenticateAsServer(cert, false, SslProtocols.Tls12, false);
                            ReadFully(ssl, Wire.Hello);
                            byte[] ch = new ChallengeFrame(Status.Ok, 1, 0, 0, null, null).Encode();
                            ssl.Write(ch, 0, ch.Length);
                            ssl.Flush();
                            ReadFully(ssl, Wire.Auth); // then the node goes away before WELCOME
                        }
                    }
                    catch (Exception)
                    {
                        // the test fails on the client's side
                    }
                }) { IsBackground = true };
                server.Start();
                var e = Assert.Throws<UnavailableException>(() => Connect(o =>
                {
                    o.Endpoints = new List<string> { "127.0.0.1:" + ((IPEndPoint)listener.LocalEndpoint).Port };
                    o.Tls = new TlsOptions { TrustedCertificates = TlsOptions.LoadCertificates(Path.Combine(d, "ca.pem")) };
                }));
                StringAssert.Contains("closed during the handshake", e.Message);
                server.Join(5000);
            }
            finally
            {
                listener.Stop();
                Directory.Delete(d, true);
            }
            // Refused NOT_LEADER: the same.
            _server.NotLeaderHint = "";
            Assert.Throws<UnavailableException>(() => Connect(o => o.RequestTimeout = TimeSpan.FromMilliseconds(300)));
        }

        private static void ReadFully(Stream s, int n)
        {
            var b = new byte[n];
            for (int at = 0; at < n;)
            {
                int got = s.Read(b, at, n - at);
                if (got <= 0)
                {
                    throw new EndOfStreamException();
                }
                at += got;
            }
        }

        [Test]
        public void GoawayMovesToTheLeaderAndResumes()
        {
            var leader = Closing(new FakeServer());
            leader.StateId = _server.StateId;
            TicketingClient c = Connect();
            Task<TicketingLock> f = c.AcquireAsync("k", TimeSpan.FromSeconds(5));
            FakeServer.Received r = _server.Expect(Op.Acquire);
            leader.Sessions = _server.Sessions; // a cluster replicates its sessions
            r.Conn.Send(new ResponseFrame(Op.Goaway, Status.Ok, 0, 0, 0, (uint)GoawayReason.Leadership, Bytes(leader.Endpoint)));
            FakeServer.Received retry = leader.Expect(Op.Acquire);
            Assert.AreEqual(r.Id, retry.Id);
            Assert.IsTrue(retry.Conn.Resumed);
            Grant(retry, 77);
            Assert.AreEqual(77UL, Tasks.Result(f).Token);
        }

        [Test]
        public void NotLeaderAnswerIsResentToTheLeaderWithTheSameId()
        {
            var leader = Closing(new FakeServer());
            leader.StateId = _server.StateId;
            TicketingClient c = Connect();
            Task rel = c.ReleaseAsync("k", 5);
            FakeServer.Received r = _server.Expect(Op.Release);
            r.Conn.Reply(r.Frame, Status.NotLeader, 0, 0, 0, Bytes(leader.Endpoint));
            FakeServer.Received again = leader.Expect(Op.Release);
            Assert.AreEqual(r.Id, again.Id);
            Assert.IsFalse(again.Conn.Resumed); // a new session there: the not-run request is still sent
            again.Conn.Ok(again.Frame);
            Tasks.Done(rel);
            Assert.IsTrue(rel.Status == TaskStatus.RanToCompletion, rel.Exception?.ToString());
        }

        [Test]
        public void MalformedFrameFromTheServerReplacesTheConnection()
        {
            TicketingClient c = Connect();
            FakeServer.Conn first = _server.NextConnection();
            _server.AutoPing = false;
            Task<TimeSpan> p = c.PingAsync();
            _server.Expect(Op.Ping);
            _server.AutoPing = true;
            first.SendRaw(new byte[] { 0, 0, 0, 5, 1, 2, 3, 4, 5 }); // length below the header
            FakeServer.Conn second = _server.NextConnection();
            Assert.IsTrue(second.Resumed);
            Tasks.Result(p); // re-sent and answered on the new connection
        }

        [Test]
        public void RandomFramesFromTheServerNeverBreakTheClient()
        {
            TicketingClient c = Connect(o => o.HeartbeatInterval = TimeSpan.Zero);
            Task<TicketingLock> f = c.AcquireAsync("k", TimeSpan.FromSeconds(30));
            FakeServer.Received acq = _server.Expect(Op.Acquire);
            Grant(acq, 5);
            TicketingLock l = Tasks.Result(f);
            var rnd = new Random(42);
            byte[] ops = { 0x10, 0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x20, 0x21, 0x7f, 0 };
            for (int i = 0; i < 500; i++)
            {
                byte[] data = new byte[rnd.Next(20)];
                rnd.NextBytes(data);
                byte op = ops[rnd.Next(ops.Length)];
                if (op == (byte)Op.Goaway)
                {
                    continue; // a valid GOAWAY only moves the connection: tested above
                }
                ulong id = rnd.Next(4) == 0 ? 0UL : (ulong)(1000 + rnd.Next(1000)); // pushes and unknown ids
                byte[] tok = new byte[8];
                rnd.NextBytes(tok);
                acq.Conn.Send(new ResponseFrame((Op)op, (Status)rnd.Next(12), id, BitConverter.ToUInt64(tok, 0), (uint)rnd.Next(), (uint)rnd.Next(), data));
            }
            Tasks.Result(c.PingAsync()); // still served on the same connection
            Assert.AreEqual(1, _server.All.Count, "no reconnect was needed");
            Assert.IsFalse(l.IsLost, "no EXPIRED matched the lock's token and key");
        }

        // ---- ACK ----

        [Test]
        public void AckIsSentOncePerBatchOfAnswersAndNeverTwiceAtOnce()
        {
            _server.AutoPing = false;
            TicketingClient c = Connect(o => o.HeartbeatInterval = TimeSpan.Zero);
            var acks = new ConcurrentQueue<FakeServer.Received>();
            var stop = new CancellationTokenSource();
            var answerer = new Thread(() =>
            {
                while (!stop.IsCancellationRequested)
                {
                    FakeServer.Received r;
                    if (!_server.Requests.TryTake(out r, 100))
                    {
                        continue;
                    }
                    if (r.Op == Op.Ping)
                    {
                        r.Conn.Ok(r.Frame);
                    }
                    else
                    {
                        acks.Enqueue(r);
                    }
                }
            }) { IsBackground = true };
            answerer.Start();
            try
            {
                for (int i = 0; i < 1500; i++)
                {
                    Tasks.Result(c.PingAsync());
                }
                Poll.Until(TimeSpan.FromSeconds(5), () => acks.Count > 0, "an ACK");
                FakeServer.Received ack;
                acks.TryPeek(out ack);
                Assert.AreEqual(Op.Ack, ack.Op);
                Assert.AreEqual(ack.Id, ack.Frame.Token, "nothing awaited: x is the next id (the ACK's own)");
                Thread.Sleep(100);
                Assert.AreEqual(1, acks.Count, "no second ACK while the first is unanswered");
                ack.Conn.Reply(ack.Frame, Status.Ok, 0, 0, 3);
                for (int i = 0; i < 600; i++)
                {
                    Tasks.Result(c.PingAsync());
                }
                Poll.Until(TimeSpan.FromSeconds(5), () => acks.Count == 2, "the next ACK");
            }
            finally
            {
                stop.Cancel();
                answerer.Join(2000);
            }
        }

        [Test]
        public void AckBoundSkipsAcquiresButNotOtherAwaitedRequests()
        {
            _server.AutoPing = false;
            TicketingClient c = Connect(o => o.HeartbeatInterval = TimeSpan.Zero);
            c.AcquireAsync("queued", TimeSpan.FromSeconds(5)); // id 1, stays queued
            Assert.AreEqual(1UL, _server.Expect(Op.Acquire).Id);
            Task<TimeSpan> stuck = c.PingAsync(); // id 2, never answered for now
            FakeServer.Received stuckPing = _server.Expect(Op.Ping);
            Assert.AreEqual(2UL, stuckPing.Id);
            FakeServer.Received ack = null;
            for (int i = 0; i < 600; i++)
            {
                Task<TimeSpan> p = c.PingAsync();
                FakeServer.Received r = _server.Next();
                if (r.Op == Op.Ack)
                {
                    Assert.IsNull(ack, "one ACK at a time");
                    ack = r;
                    r = _server.Next();
                }
                Assert.AreEqual(Op.Ping, r.Op);
                r.Conn.Ok(r.Frame);
                Tasks.Result(p);
            }
            Assert.IsNotNull(ack, "an ACK within 600 answers");
            Assert.AreEqual(2UL, ack.Frame.Token, "x is the lowest awaited id that is not an ACQUIRE");
            stuckPing.Conn.Ok(stuckPing.Frame);
            Tasks.Result(stuck);
        }

        // ---- locks ----

        [Test]
        public void ReleaseNotHeldFiresLostOnceAndThrows()
        {
            TicketingClient c = Connect();
            TicketingLock l = Held(c, "k", 8);
            int lostCalls = 0;
            l.HandleLostToken.Register(() => Interlocked.Increment(ref lostCalls));
            Task rel = l.ReleaseAsync();
            FakeServer.Received r = _server.Expect(Op.Release);
            r.Conn.Reply(r.Frame, Status.NotHeld);
            Assert.AreEqual(LostReason.NotHeld, Tasks.Failure<LockLostException>(rel).Reason);
            Poll.Until(TimeSpan.FromSeconds(2), () => Volatile.Read(ref lostCalls) == 1, "the lost callback");
            Tasks.Ok(Task.Run(() => l.ReleaseAsync())); // released (found gone): nothing more is sent
            Assert.IsNull(_server.Poll(200));
            Assert.AreEqual(1, Volatile.Read(ref lostCalls));
            Assert.IsTrue(l.IsReleased);
        }

        [Test]
        public void UsingReleasesAndReportsALostLock()
        {
            TicketingClient c = Connect();
            Task<TicketingLock> f = c.AcquireAsync("k", TimeSpan.FromSeconds(30));
            FakeServer.Received a = _server.Expect(Op.Acquire);
            Grant(a, 8);
            TicketingLock l = Tasks.Result(f);
            Task body = Task.Run(() =>
            {
                using (l)
                {
                    a.Conn.Send(new ResponseFrame(Op.Expired, Status.Ok, 0, 8, 0, 1, Bytes("k")));
                    l.Lost.Wait(5000);
                }
            });
            FakeServer.Received rel = _server.Expect(Op.Release);
            rel.Conn.Reply(rel.Frame, Status.NotHeld);
            Assert.AreEqual(LostReason.Expired, Tasks.Failure<LockLostException>(body).Reason);

            TicketingLock quiet = Held(c, "q", 9, new AcquireOptions(TimeSpan.FromSeconds(30)) { ThrowOnLost = false });
            a.Conn.Send(new ResponseFrame(Op.Expired, Status.Ok, 0, 9, 0, 1, Bytes("q")));
            Tasks.Result(quiet.Lost);
            Task quietDispose = Task.Run(() => quiet.Dispose());
            FakeServer.Received qr = _server.Expect(Op.Release);
            qr.Conn.Reply(qr.Frame, Status.NotHeld);
            Tasks.Done(quietDispose);
            Assert.AreEqual(TaskStatus.RanToCompletion, quietDispose.Status, "ThrowOnLost = false is the opt-out");
        }

        [Test]
        public void WithLockReportsALossAfterTheBody()
        {
            TicketingClient c = Connect();
            FakeServer.Conn conn = null;
            Task t = c.WithLockAsync("k", new AcquireOptions(TimeSpan.FromSeconds(30)), async l =>
            {
                conn.Send(new ResponseFrame(Op.Expired, Status.Ok, 0, l.Token, 0, 1, Bytes("k")));
                await Task.Delay(TimeSpan.FromSeconds(10), l.HandleLostToken); // cancelled by the loss
            });
            FakeServer.Received a = _server.Expect(Op.Acquire);
            conn = a.Conn;
            Grant(a, 8);
            FakeServer.Received rel = _server.Expect(Op.Release);
            rel.Conn.Reply(rel.Frame, Status.NotHeld);
            Assert.AreEqual(LostReason.Expired, Tasks.Failure<LockLostException>(t).Reason);

            Task<int> ok = c.WithLockAsync("k", new AcquireOptions(TimeSpan.FromSeconds(30)), l => Task.FromResult(42));
            Grant(_server.Expect(Op.Acquire), 9);
            FakeServer.Received rel2 = _server.Expect(Op.Release);
            Assert.AreEqual(9UL, rel2.Frame.Token);
            rel2.Conn.Ok(rel2.Frame);
            Assert.AreEqual(42, Tasks.Result(ok));

            Task<int> failing = c.WithLockAsync<int>("k", new AcquireOptions(TimeSpan.FromSeconds(30)), l => { throw new InvalidOperationException("body"); });
            Grant(_server.Expect(Op.Acquire), 10);
            FakeServer.Received rel3 = _server.Expect(Op.Release);
            rel3.Conn.Ok(rel3.Frame);
            Assert.AreEqual("body", Tasks.Failure<InvalidOperationException>(failing).Message, "the body's own failure wins");
        }

        [Test]
        public void CloseDoesNotReleaseUnlessAsked()
        {
            TicketingClient c = Connect();
            TicketingLock l = Held(c, "k", 8);
            c.Dispose();
            c.Dispose(); // idempotent
            Assert.IsNull(_server.Poll(300), "close sends no RELEASE");
            Assert.IsFalse(l.IsLost);
            l.Dispose(); // after the client: nothing to do, nothing thrown
            Tasks.Failure<ClosedException>(l.ReleaseAsync());

            TicketingClient c2 = Connect(o => o.ReleaseOnClose = true);
            Held(c2, "k2", 9);
            Task closing = c2.CloseAsync();
            FakeServer.Received rel = _server.Expect(Op.Release);
            Assert.AreEqual(9UL, rel.Frame.Token);
            rel.Conn.Ok(rel.Frame);
            Tasks.Done(closing);
        }

        [Test]
        public void ExtendMovesTheDeadlineAndKeepAliveStopsAtRelease()
        {
            TicketingClient c = Connect();
            TicketingLock l = Held(c, "k", 8, new AcquireOptions(TimeSpan.FromMilliseconds(300)) { KeepAlive = true });
            for (int i = 0; i < 3; i++)
            {
                FakeServer.Received ext = _server.Expect(Op.Extend);
                Assert.AreEqual(8UL, ext.Frame.Token);
                Assert.AreEqual(300u, ext.Frame.LeaseMs);
                CollectionAssert.AreEqual(Bytes("k"), ext.Frame.Key);
                ext.Conn.Reply(ext.Frame, Status.Ok, 8, 300);
            }
            Assert.IsFalse(l.IsLost, "kept alive past its first lease");
            Task rel = l.ReleaseAsync();
            FakeServer.Received r = _server.Next();
            while (r.Op == Op.Extend)
            {
                r.Conn.Reply(r.Frame, Status.Ok, 8, 300); // one may have been on its way
                r = _server.Next();
            }
            Assert.AreEqual(Op.Release, r.Op);
            r.Conn.Ok(r.Frame);
            Tasks.Done(rel);
            Assert.IsNull(_server.Poll(400), "no extend after the release");
            Assert.IsFalse(l.IsLost);
        }

        [Test]
        public void ExtendSetsTheNewDeadline()
        {
            TicketingClient c = Connect();
            TicketingLock l = Held(c, "k", 8, new AcquireOptions(TimeSpan.FromMilliseconds(200)));
            Task<TimeSpan> e = l.ExtendAsync(TimeSpan.FromSeconds(3));
            FakeServer.Received r = _server.Expect(Op.Extend);
            Assert.AreEqual(3000u, r.Frame.LeaseMs);
            r.Conn.Reply(r.Frame, Status.Ok, 8, 3000);
            Assert.AreEqual(TimeSpan.FromSeconds(3), Tasks.Result(e));
            Assert.AreEqual(TimeSpan.FromSeconds(3), l.Lease);
            Thread.Sleep(400);
            Assert.IsFalse(l.IsLost, "the deadline moved with the extend");
            Assert.That(l.TimeLeft.TotalMilliseconds, Is.InRange(2000, 3000));
        }

        [Test]
        public void MaxHoldStopsKeepAlive()
        {
            TicketingClient c = Connect();
            TicketingLock l = Held(c, "k", 8, new AcquireOptions(TimeSpan.FromMilliseconds(150)) { KeepAlive = true, MaxHold = TimeSpan.FromMilliseconds(200) });
            FakeServer.Received ext = _server.Expect(Op.Extend);
            ext.Conn.Reply(ext.Frame, Status.Ok, 8, 150);
            Assert.AreEqual(LostReason.Expired, Tasks.Result(l.Lost));
            FakeServer.Received more;
            int extra = 0;
            while ((more = _server.Poll(100)) != null && extra++ < 5)
            {
                Assert.AreEqual(Op.Extend, more.Op);
                more.Conn.Reply(more.Frame, Status.Ok, 8, 150);
            }
            Assert.Less(extra, 5, "keep-alive stopped");
        }

        [Test]
        public void ExtendNotHeldLosesTheLock()
        {
            TicketingClient c = Connect();
            TicketingLock l = Held(c, "k", 8);
            Task<TimeSpan> e = l.ExtendAsync(TimeSpan.FromSeconds(60));
            FakeServer.Received r = _server.Expect(Op.Extend);
            Assert.AreEqual(60000u, r.Frame.LeaseMs);
            r.Conn.Reply(r.Frame, Status.NotHeld);
            Assert.AreEqual(LostReason.NotHeld, Tasks.Failure<LockLostException>(e).Reason);
            Assert.AreEqual(LostReason.NotHeld, l.LostReason);
            Tasks.Failure<LockLostException>(l.ExtendAsync(TimeSpan.FromSeconds(1)));
            Assert.Throws<ArgumentOutOfRangeException>(() => l.ExtendAsync(TimeSpan.Zero));
        }

        [Test]
        public void RefuseHeld()
        {
            TicketingClient c = Connect();
            Held(c, "k", 8);
            Assert.Throws<AlreadyHeldException>(() => Tasks.Result(c.AcquireAsync("k", new AcquireOptions(TimeSpan.FromSeconds(1)) { RefuseHeld = true })));
            Assert.IsNull(_server.Poll(200));
            c.AcquireAsync("k", TimeSpan.FromSeconds(1)); // without RefuseHeld it queues behind itself
            Assert.AreEqual(Op.Acquire, _server.Expect(Op.Acquire).Op);
        }

        [Test]
        public void VerifySendsInspectWithTheToken()
        {
            TicketingClient c = Connect();
            TicketingLock l = Held(c, "k", 8);
            Task<bool> v = l.VerifyAsync();
            FakeServer.Received r = _server.Expect(Op.Inspect);
            Assert.AreEqual(8UL, r.Frame.Token);
            byte[] data = new byte[12];
            data[11] = (byte)(InspectFlags.Held | InspectFlags.TokenMatch);
            r.Conn.Reply(r.Frame, Status.Ok, 8, 1000, 0, data);
            Assert.IsTrue(Tasks.Result(v));
            v = l.VerifyAsync();
            r = _server.Expect(Op.Inspect);
            data[11] = (byte)InspectFlags.Held;
            r.Conn.Reply(r.Frame, Status.Ok, 0, 1000, 0, data);
            Assert.IsFalse(Tasks.Result(v));
        }

        [Test]
        public void BinaryKeysTravelAsBytes()
        {
            TicketingClient c = Connect();
            byte[] key = { 0x00, 0xff, 0x10, 0xc3, 0xbc };
            Task<TicketingLock> f = c.AcquireAsync(key, new AcquireOptions(TimeSpan.FromSeconds(1)));
            FakeServer.Received r = _server.Expect(Op.Acquire);
            CollectionAssert.AreEqual(key, r.Frame.Key);
            Grant(r, 3);
            TicketingLock l = Tasks.Result(f);
            CollectionAssert.AreEqual(key, l.KeyBytes);
            StringAssert.StartsWith("0x00ff10c3bc", l.Key);
        }
    }
}
