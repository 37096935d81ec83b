using System;
using System.Collections.Concurrent;
using System.Collections.Generic;
using System.Diagnostics;
using System.Linq;
using System.Threading;
using System.Threading.Tasks;
using NUnit.Framework;
using Ticketing.Protocol;

namespace Ticketing.Tests
{
    /// <summary>Integration tests against the real server binary, started by the tests on 127.0.0.1.</summary>
    [TestFixture]
    [Timeout(60000)]
    public class RealServerTests : TestBase
    {
        private ServerProcess _server;

        [TestFixtureSetUp]
        public void StartServer()
        {
            _server = ServerProcess.Start();
        }

        [TestFixtureTearDown]
        public void StopServer()
        {
            _server?.Dispose();
        }

        private TicketingClient Client(string endpoint = null, Action<TicketingOptions> tweak = null)
        {
            var o = new TicketingOptions
            {
                Endpoints = new List<string> { endpoint ?? _server.Endpoint },
                ReconnectBackoffMin = TimeSpan.FromMilliseconds(20),
                ReconnectBackoffMax = TimeSpan.FromMilliseconds(200),
            };
            tweak?.Invoke(o);
            return Closing(Tasks.Result(TicketingClient.ConnectAsync(o)));
        }

        private static void Waiters(TicketingClient observer, string key, long n)
        {
            Poll.Until(TimeSpan.FromSeconds(5), () => Tasks.Result(observer.InspectAsync(key)).Waiters == n, n + " waiters on " + key);
        }

        /// <summary>
        /// A process that used a client from 16 concurrent tasks and disposed it exits 0, ten times
        /// out of ten, and Mono's timer scheduler thread never started: the client makes no
        /// System.Threading.Timer (Mono crashed at exit in that thread's sort, a timer per request).
        /// </summary>
        [Test]
        [Timeout(120000)]
        public void ExitsCleanlyAfterConcurrentUse()
        {
            string exe = System.IO.Path.Combine(System.IO.Path.GetDirectoryName(typeof(RealServerTests).Assembly.Location), "Ticketing.ExitCheck.exe");
            Assert.IsTrue(System.IO.File.Exists(exe), exe + " is missing (build.sh builds it)");
            for (int run = 1; run <= 10; run++)
            {
                var psi = new ProcessStartInfo("mono", "\"" + exe + "\" " + _server.Endpoint + " 200")
                {
                    UseShellExecute = false,
                    RedirectStandardOutput = true,
                    RedirectStandardError = true,
                };
                using (Process p = Process.Start(psi))
                {
                    Task<string> stdout = p.StandardOutput.ReadToEndAsync();
                    Task<string> stderr = p.StandardError.ReadToEndAsync();
                    Assert.IsTrue(p.WaitForExit(60000), "run " + run + " did not exit within 60 s");
                    p.WaitForExit();
                    string output = stdout.Result + stderr.Result;
                    Assert.AreEqual(0, p.ExitCode, "run " + run + " exited " + p.ExitCode + ":\n" + output);
                    StringAssert.Contains("Mono timer scheduler thread: no", output);
                    StringAssert.DoesNotContain("FATAL", output);
                }
            }
        }

        /// <summary>
        /// A grant whose caller continuation runs after the client was closed fails with
        /// ClosedException, not ServerRestartedException: the exit-check program once exited 1
        /// under two CPU hogs when an answer came, Dispose ran, and then the acquire's continuation
        /// found the engine closed and reported a restart that never happened.
        /// </summary>
        [Test]
        public void GrantAdoptedAfterCloseFailsAsClosed()
        {
            TicketingClient c = Client();
            byte[] key = System.Text.Encoding.UTF8.GetBytes("adopt-after-close");
            var r = new Request(Op.Acquire, key, 0, 5000, 0, false);
            var f = new ResponseFrame(Op.Acquire, Status.Ok, 1, 7, 5000, 0, null);
            c.Dispose();
            var e = Assert.Throws<ClosedException>(() => c.Adopt(key, "adopt-after-close", r, f, new AcquireOptions(TimeSpan.FromSeconds(5))));
            StringAssert.Contains("closed while acquire of adopt-after-close was answered", e.Message);
        }

        [Test]
        public async Task AcquireInspectRelease()
        {
            TicketingClient a = Client();
            TicketingClient r = Client();
            TicketingLock l = await a.AcquireAsync("basic", TimeSpan.FromSeconds(5));
            Assert.Greater(l.Token, 0UL);
            LockInfo info = await r.InspectAsync("basic");
            Assert.IsTrue(info.Held);
            Assert.AreEqual(0UL, info.Token, "another session does not see the token");
            Assert.Greater(info.LeaseLeft.TotalMilliseconds, 3000);
            LockInfo mine = await a.InspectAsync("basic");
            Assert.IsTrue(mine.HeldByThisSession);
            Assert.AreEqual(l.Token, mine.Token);
            Assert.IsTrue((await r.InspectAsync("basic", l.Token)).TokenMatches, "the token is shown to whoever carries it");
            Assert.IsTrue(await l.VerifyAsync());
            await l.ReleaseAsync();
            Assert.IsFalse((await r.InspectAsync("basic")).Held);
            Assert.IsFalse(l.IsLost);
            Assert.IsTrue(l.IsReleased);
            await l.ReleaseAsync(); // again: nothing
            Assert.GreaterOrEqual(await a.PingAsync(), TimeSpan.Zero);
        }

        [Test]
        public async Task TryAcquireAndWaitTimeout()
        {
            TicketingClient r = Client();
            TicketingClient a = Client();
            TicketingLock held = await r.AcquireAsync("wt", TimeSpan.FromSeconds(10));
            Assert.IsNull(await a.TryAcquireAsync("wt", TimeSpan.FromSeconds(1)));
            Tasks.Failure<NotAcquiredException>(a.AcquireAsync("wt", TimeSpan.FromSeconds(1), TimeSpan.Zero));
            var sw = Stopwatch.StartNew();
            var e = Tasks.Failure<NotAcquiredException>(a.AcquireAsync("wt", TimeSpan.FromSeconds(1), TimeSpan.FromMilliseconds(300)));
            Assert.That(sw.ElapsedMilliseconds, Is.InRange(290, 2000), "timed out after " + sw.ElapsedMilliseconds + " ms");
            StringAssert.Contains("wt", e.Message);
            Assert.AreEqual(0L, (await r.InspectAsync("wt")).Waiters);
            Assert.IsNull(await a.TryAcquireAsync("wt", TimeSpan.FromSeconds(1), TimeSpan.FromMilliseconds(100)));
            await held.ReleaseAsync();
            TicketingLock l = await a.TryAcquireAsync("wt", TimeSpan.FromSeconds(1));
            Assert.IsNotNull(l);
            Assert.Greater(l.Token, held.Token);
            await l.ReleaseAsync();
        }

        [Test]
        public async Task FifoAcrossClients()
        {
            TicketingClient r = Client();
            TicketingLock held = await r.AcquireAsync("fifo", TimeSpan.FromSeconds(10));
            var waiters = new[] { Client(), Client(), Client() };
            var order = new ConcurrentQueue<string>();
            var grants = new List<Task<ulong>>();
            for (int i = 0; i < waiters.Length; i++)
            {
                string name = "w" + i;
                TicketingClient w = waiters[i];
                grants.Add(Task.Run(async () =>
                {
                    TicketingLock l = await w.AcquireAsync("fifo", TimeSpan.FromSeconds(10));
                    order.Enqueue(name);
                    await l.ReleaseAsync();
                    return l.Token;
                }));
                Waiters(r, "fifo", i + 1);
            }
            await held.ReleaseAsync();
            ulong last = held.Token;
            foreach (Task<ulong> g in grants)
            {
                ulong t = Tasks.Result(g);
                Assert.Greater(t, last, "tokens increase");
                last = t;
            }
            CollectionAssert.AreEqual(new[] { "w0", "w1", "w2" }, order.ToArray());
        }

        [Test]
        public async Task CancelWithdrawsTheWait()
        {
            TicketingClient r = Client();
            TicketingClient a = Client();
            TicketingLock held = await r.AcquireAsync("cancel", TimeSpan.FromSeconds(10));
            var cts = new CancellationTokenSource();
            Task<TicketingLock> f = a.AcquireAsync("cancel", TimeSpan.FromSeconds(10), null, cts.Token);
            Waiters(r, "cancel", 1);
            cts.Cancel();
            Tasks.Failure<OperationCanceledException>(f);
            Assert.AreEqual(0L, (await r.InspectAsync("cancel")).Waiters, "withdrawn before the call returned");
            await held.ReleaseAsync();
            await Task.Delay(100);
            Assert.IsFalse((await r.InspectAsync("cancel")).Held, "nobody was granted");
        }

        [Test]
        public async Task CancelRacingGrantsNeverLeavesALockHeld()
        {
            TicketingClient r = Client();
            TicketingClient a = Client();
            for (int round = 0; round < 10; round++)
            {
                await r.AcquireAsync("race", TimeSpan.FromMilliseconds(50));
                var cts = new CancellationTokenSource();
                Task<TicketingLock> f = a.AcquireAsync("race", TimeSpan.FromSeconds(10), null, cts.Token);
                cts.CancelAfter(round * 8); // spread over the 50 ms lease of R's lock: before and after the grant
                Tasks.Done(f);
                if (f.Status == TaskStatus.RanToCompletion)
                {
                    await f.Result.ReleaseAsync(); // granted before the cancel: an ordinary lock
                }
                else
                {
                    Tasks.Failure<OperationCanceledException>(f);
                }
                int n = round;
                await Poll.UntilAsync(TimeSpan.FromSeconds(3), async () =>
                {
                    LockInfo i = await r.InspectAsync("race");
                    return !i.Held && i.Waiters == 0;
                }, "the race key free in round " + n);
            }
        }

        [Test]
        public async Task LostOnExpiryComesBeforeTheNextGrant()
        {
            TicketingClient a = Client();
            TicketingClient b = Client();
            TicketingLock l = await a.AcquireAsync("expiry", TimeSpan.FromMilliseconds(400));
            var heard = new TaskCompletionSource<LostReason?>();
            l.HandleLostToken.Register(() => heard.TrySetResult(l.LostReason));
            TicketingLock next = await b.AcquireAsync("expiry", TimeSpan.FromSeconds(5));
            // the local deadline (lease * 0.998 - 5 ms from the send) passed before the server's expiry
            Assert.IsTrue(l.IsLost, "the holder knows the lock is lost before the next holder is granted");
            Assert.AreEqual(LostReason.Expired, Tasks.Result(heard.Task));
            Assert.Greater(next.Token, l.Token);
            Assert.AreEqual(LostReason.Expired, Tasks.Failure<LockLostException>(l.ReleaseAsync()).Reason);
            await next.ReleaseAsync();
        }

        [Test]
        public async Task KeepAliveHoldsPastTheLeaseAndStopsAtRelease()
        {
            // A lease long enough that a keep-alive extend delayed by a busy machine still lands
            // in time (it is sent at a third of the lease); held for one and a half leases.
            const int leaseMs = 1500;
            TicketingClient a = Client();
            TicketingClient r = Client();
            TicketingLock l = await a.AcquireAsync("keepalive", new AcquireOptions(TimeSpan.FromMilliseconds(leaseMs)) { KeepAlive = true });
            await Task.Delay(leaseMs + leaseMs / 2);
            Assert.IsFalse(l.IsLost, "lost while kept alive");
            Assert.IsTrue(await l.VerifyAsync());
            Assert.IsTrue((await r.InspectAsync("keepalive")).Held);
            await l.ReleaseAsync();
            Assert.IsFalse((await r.InspectAsync("keepalive")).Held);
            await Task.Delay(leaseMs / 3 * 2); // two keep-alive periods: an extend after the release would show
            Assert.IsFalse((await r.InspectAsync("keepalive")).Held, "held again after the release");
            Assert.IsFalse(l.IsLost);
        }

        [Test]
        public async Task ExtendAndOwnerIsTheToken()
        {
            TicketingClient a = Client();
            TicketingClient b = Client();
            TicketingLock l = await a.AcquireAsync("owner", TimeSpan.FromMilliseconds(400));
            Assert.AreEqual(TimeSpan.FromSeconds(2), await l.ExtendAsync(TimeSpan.FromSeconds(2)));
            await Task.Delay(600);
            Assert.IsFalse(l.IsLost);
            Assert.IsTrue(await l.VerifyAsync());
            Assert.AreEqual(TimeSpan.FromSeconds(3), await b.ExtendAsync("owner", l.Token, TimeSpan.FromSeconds(3)));
            await b.ReleaseAsync("owner", l.Token);
            Assert.IsFalse(await l.VerifyAsync());
            Tasks.Failure<NotHeldException>(b.ReleaseAsync("owner", l.Token));
            Tasks.Failure<NotHeldException>(b.ExtendAsync("owner", l.Token, TimeSpan.FromSeconds(1)));
            Assert.AreEqual(LostReason.NotHeld, Tasks.Failure<LockLostException>(l.ReleaseAsync()).Reason);
            Assert.AreEqual(LostReason.NotHeld, Tasks.Result(l.Lost));
        }

        [Test]
        public void ServerRejectsAKeyAboveItsLimit()
        {
            TicketingClient a = Client();
            var e = Tasks.Failure<InvalidRequestException>(a.AcquireAsync(new string('k', 300), TimeSpan.FromSeconds(1)));
            Assert.AreEqual(InvalidField.Key, e.Field);
            Tasks.Result(a.PingAsync()); // the connection stays
        }

        [Test]
        public async Task RefuseHeldAndSelfQueueing()
        {
            TicketingClient a = Client();
            TicketingLock l = await a.AcquireAsync("self", TimeSpan.FromSeconds(5));
            Tasks.Failure<AlreadyHeldException>(a.AcquireAsync("self", new AcquireOptions(TimeSpan.FromSeconds(1)) { RefuseHeld = true }));
            Assert.AreEqual(0L, (await a.InspectAsync("self")).Waiters);
            Task<TicketingLock> second = a.AcquireAsync("self", TimeSpan.FromSeconds(5));
            Waiters(a, "self", 1);
            Assert.IsFalse(second.IsCompleted, "the same client queues behind itself");
            await l.ReleaseAsync();
            await Tasks.Result(second).ReleaseAsync();
        }

        [Test]
        public void ManyTasksShareOneClient()
        {
            TicketingClient c = Client();
            const int workers = 32;
            const int rounds = 15;
            int inside = 0;
            int overlaps = 0;
            var lastToken = new ConcurrentDictionary<string, ulong>();
            var all = Enumerable.Range(0, workers).Select(w => Task.Run(async () =>
            {
                for (int i = 0; i < rounds; i++)
                {
                    string key = "many-" + (w % 2);
                    using (TicketingLock l = await c.AcquireAsync(key, TimeSpan.FromSeconds(10)))
                    {
                        if (key == "many-0" && Interlocked.Increment(ref inside) != 1)
                        {
                            Interlocked.Increment(ref overlaps);
                        }
                        ulong prev = 0;
                        lastToken.AddOrUpdate(key, l.Token, (k, p) =>
                        {
                            prev = p;
                            return l.Token;
                        });
                        if (prev >= l.Token)
                        {
                            Interlocked.Increment(ref overlaps);
                        }
                        await Task.Yield();
                        if (key == "many-0")
                        {
                            Interlocked.Decrement(ref inside);
                        }
                    }
                    await c.PingAsync();
                }
            })).ToArray();
            Assert.IsTrue(Task.WaitAll(all, TimeSpan.FromSeconds(50)), "every task finished");
            Assert.AreEqual(0, overlaps, "one holder at a time, tokens increasing");
            Assert.IsFalse(Tasks.Result(c.InspectAsync("many-0")).Held);
        }

        [Test]
        public void ManyClientsOnOneKey()
        {
            var cs = Enumerable.Range(0, 6).Select(i => Client()).ToList();
            int inside = 0;
            int bad = 0;
            var all = cs.Select(c => Task.Run(async () =>
            {
                for (int i = 0; i < 15; i++)
                {
                    using (TicketingLock l = await c.AcquireAsync("shared", TimeSpan.FromSeconds(10)))
                    {
                        if (Interlocked.Increment(ref inside) != 1 || l.Token == 0)
                        {
                            Interlocked.Increment(ref bad);
                        }
                        await Task.Yield();
                        Interlocked.Decrement(ref inside);
                    }
                }
            })).ToArray();
            Assert.IsTrue(Task.WaitAll(all, TimeSpan.FromSeconds(50)), "every client finished");
            Assert.AreEqual(0, bad);
        }

        [Test]
        public async Task ResumeKeepsTheQueuePlaceAndARetryIsNotASecondGrant()
        {
            TicketingClient r = Client();
            TicketingLock held = await r.AcquireAsync("resume", TimeSpan.FromSeconds(10));
            var p1 = Closing(new Proxy(_server.Endpoint));
            var p2 = Closing(new Proxy(_server.Endpoint));
            TicketingClient a = Client(p1.Endpoint);
            TicketingClient b = Client(p2.Endpoint);
            Task<TicketingLock> fa = a.AcquireAsync("resume", TimeSpan.FromSeconds(10));
            Waiters(r, "resume", 1);
            Task<TicketingLock> fb = b.AcquireAsync("resume", TimeSpan.FromSeconds(10));
            Waiters(r, "resume", 2);
            p1.CutAll(); // A's connection drops; it reconnects and resumes its session
            Poll.Until(TimeSpan.FromSeconds(5), () => p1.Accepted == 2, "A reconnected");
            await a.PingAsync();
            Assert.AreEqual(2L, (await r.InspectAsync("resume")).Waiters, "A kept its place");
            await held.ReleaseAsync();
            TicketingLock la = Tasks.Result(fa);
            Assert.IsFalse(fb.IsCompleted, "B waits behind A");
            await la.ReleaseAsync();
            TicketingLock lb = Tasks.Result(fb);
            Assert.Greater(lb.Token, la.Token);
            await lb.ReleaseAsync();
            Assert.IsFalse(la.IsLost);
        }

        [Test]
        public async Task ConnectionDropWhileHoldingKeepsTheLock()
        {
            var p = Closing(new Proxy(_server.Endpoint));
            TicketingClient a = Client(p.Endpoint);
            TicketingClient r = Client();
            TicketingLock l = await a.AcquireAsync("kept", new AcquireOptions(TimeSpan.FromMilliseconds(600)) { KeepAlive = true });
            p.CutAll();
            Poll.Until(TimeSpan.FromSeconds(5), () => p.Accepted == 2, "A reconnected");
            await Task.Delay(900); // past the first lease: keep-alive continued after the reconnect
            Assert.IsFalse(l.IsLost);
            Assert.IsTrue((await r.InspectAsync("kept", l.Token)).TokenMatches);
            await l.ReleaseAsync();
        }

        [Test]
        public void AuthWithTheSharedToken()
        {
            using (ServerProcess s = ServerProcess.Start(new Dictionary<string, string> { { "TICKETING_TOKEN", "correct horse" } }))
            {
                TicketingClient ok = Client(s.Endpoint, o => o.Token = "correct horse");
                Tasks.Result(ok.PingAsync());
                Tasks.Ok(Tasks.Result(ok.AcquireAsync("auth", TimeSpan.FromSeconds(1))).ReleaseAsync());
                var wrong = Assert.Throws<AuthFailedException>(() => Client(s.Endpoint, o => o.Token = "wrong"));
                StringAssert.Contains("rejected the token", wrong.Message);
                var none = Assert.Throws<AuthFailedException>(() => Client(s.Endpoint));
                StringAssert.Contains("requires a token", none.Message);
            }
            var downgrade = Assert.Throws<AuthFailedException>(() => Client(null, o => o.Token = "t"));
            StringAssert.Contains("does not require a token", downgrade.Message);
        }

        [Test]
        public void TlsAndMutualTls()
        {
            using (Certs certs = Certs.Make())
            {
                var trust = TlsOptions.LoadCertificates(certs.Ca);
                using (ServerProcess s = ServerProcess.Start(new Dictionary<string, string>
                {
                    { "TICKETING_TLS_CERT", certs.ServerCert },
                    { "TICKETING_TLS_KEY", certs.ServerKey },
                }))
                {
                    TicketingClient c = Client(s.Endpoint, o => o.Tls = new TlsOptions { TrustedCertificates = trust, ServerName = "localhost" });
                    Tasks.Ok(Tasks.Result(c.AcquireAsync("tls", TimeSpan.FromSeconds(1))).ReleaseAsync());
                    Tasks.Result(Client(s.Endpoint, o => o.Tls = new TlsOptions { TrustedCertificates = trust }).PingAsync()); // the IP in the certificate

                    var untrusted = Assert.Throws<TlsException>(() => Client(s.Endpoint, o =>
                    {
                        o.ConnectTimeout = TimeSpan.FromSeconds(2);
                        o.Tls = new TlsOptions { TrustedCertificates = TlsOptions.LoadCertificates(certs.ClientCa), ServerName = "localhost" };
                    }));
                    StringAssert.Contains("rejected", untrusted.Message);
                    Assert.Throws<TlsException>(() => Client(s.Endpoint, o =>
                    {
                        o.ConnectTimeout = TimeSpan.FromSeconds(2);
                        o.Tls = new TlsOptions { TrustedCertificates = trust, ServerName = "not-the-server.example" };
                    }));
                    Assert.Throws<TlsException>(() => Client(s.Endpoint, o =>
                    {
                        o.ConnectTimeout = TimeSpan.FromSeconds(2);
                        o.Tls = new TlsOptions { TrustedCertificates = TlsOptions.LoadCertificates(certs.ClientCa) };
                    }), "by IP address, an untrusted chain is refused too");
                    Assert.Throws<TlsException>(() => Client(s.Endpoint, o =>
                    {
                        o.ConnectTimeout = TimeSpan.FromSeconds(2);
                        o.Tls = new TlsOptions { TrustedCertificates = trust, ServerName = "10.1.2.3" };
                    }), "an address the certificate does not list");
                    Assert.Catch<TicketingException>(() => Client(s.Endpoint, o => o.ConnectTimeout = TimeSpan.FromSeconds(2)), "plaintext to a TLS server");
                }
                var toPlain = Assert.Throws<TlsException>(() => Client(null, o =>
                {
                    o.ConnectTimeout = TimeSpan.FromSeconds(2);
                    o.Tls = new TlsOptions { TrustedCertificates = trust };
                }));
                StringAssert.Contains("is the server using TLS", toPlain.Message);

                using (ServerProcess s = ServerProcess.Start(new Dictionary<string, string>
                {
                    { "TICKETING_TLS_CERT", certs.ServerCert },
                    { "TICKETING_TLS_KEY", certs.ServerKey },
                    { "TICKETING_TLS_CLIENT_CA", certs.ClientCa },
                }))
                {
                    foreach (string key in new[] { certs.ClientKey, certs.ClientKeySec1 })
                    {
                        TicketingClient c = Client(s.Endpoint, o => o.Tls = new TlsOptions
                        {
                            TrustedCertificates = trust,
                            ServerName = "localhost",
                            ClientCertificate = TlsOptions.LoadClientCertificate(certs.ClientCert, key),
                        });
                        Tasks.Ok(Tasks.Result(c.AcquireAsync("mtls", TimeSpan.FromSeconds(1))).ReleaseAsync());
                    }
                    for (int i = 0; i < 3; i++)
                    {
                        Assert.Throws<TlsException>(() => Tasks.Result(Client(s.Endpoint, o =>
                        {
                            o.ConnectTimeout = TimeSpan.FromSeconds(2);
                            o.Tls = new TlsOptions { TrustedCertificates = trust, ServerName = "localhost" };
                        }).PingAsync()), "no client certificate");
                    }
                }
            }
        }

        [Test]
        public async Task RestartLosesEveryLockAndFailsWaiters()
        {
            using (ServerProcess s = ServerProcess.Start())
            {
                TicketingClient a = Client(s.Endpoint);
                TicketingClient r = Client(s.Endpoint);
                TicketingLock l = await a.AcquireAsync("k", new AcquireOptions(TimeSpan.FromSeconds(10)) { KeepAlive = true });
                TicketingLock other = await r.AcquireAsync("k2", TimeSpan.FromSeconds(10));
                Task<TicketingLock> waiter = a.AcquireAsync("k2", TimeSpan.FromSeconds(10));
                Waiters(r, "k2", 1);
                string session = a.SessionId;
                s.Restart(); // SIGKILL, then a new process on the same port and data dir: a new state id
                Assert.AreEqual(LostReason.ServerRestarted, Tasks.Result(l.Lost));
                Assert.IsTrue(l.HandleLostToken.IsCancellationRequested);
                Tasks.Failure<ServerRestartedException>(waiter);
                Assert.AreNotEqual(session, a.SessionId, "a new session after a restart");
                Assert.AreEqual(0L, (await a.InspectAsync("k2")).Waiters, "the waiter was not re-queued");
                Tasks.Failure<LockLostException>(l.ReleaseAsync());
                TicketingLock again = await a.AcquireAsync("k", TimeSpan.FromSeconds(1), TimeSpan.Zero);
                Assert.Greater(again.Token, l.Token, "tokens only grow across restarts");
                await again.ReleaseAsync();
                Assert.Greater(other.Token, 0UL);
            }
        }

        [Test]
        public async Task GracefulStopTellsHoldersAndWaiters()
        {
            using (ServerProcess s = ServerProcess.Start())
            {
                TicketingClient a = Client(s.Endpoint);
                TicketingClient b = Client(s.Endpoint);
                TicketingLock l = await a.AcquireAsync("stop", TimeSpan.FromSeconds(10));
                Task<TicketingLock> waiter = b.AcquireAsync("stop", TimeSpan.FromSeconds(10));
                Waiters(a, "stop", 1);
                s.Terminate();
                Assert.AreEqual(LostReason.ServerStopping, Tasks.Result(l.Lost));
                Tasks.Failure<ShuttingDownException>(waiter);
                Assert.IsTrue(s.WaitForExit(10000));
            }
        }

        [Test]
        public async Task SessionEndsWhenTheGraceRunsOut()
        {
            using (ServerProcess s = ServerProcess.Start(new Dictionary<string, string> { { "TICKETING_SESSION_GRACE", "0" } }))
            {
                var p = Closing(new Proxy(s.Endpoint));
                TicketingClient r = Client(s.Endpoint);
                TicketingClient a = Client(p.Endpoint);
                TicketingLock held = await r.AcquireAsync("grace", TimeSpan.FromSeconds(10));
                TicketingLock mine = await a.AcquireAsync("grace-held", TimeSpan.FromSeconds(10));
                Task<TicketingLock> waiter = a.AcquireAsync("grace", TimeSpan.FromSeconds(10));
                Waiters(r, "grace", 1);
                p.CutAll();
                Tasks.Failure<ConnectionLostException>(waiter);
                Assert.IsFalse(mine.IsLost, "a held lock keeps its deadline");
                Waiters(r, "grace", 0);
                await held.ReleaseAsync();
                await mine.ReleaseAsync();
            }
        }
    }
}
