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
    /// Where answers complete (Connection's remarks): on the reader thread, which gives the reading
    /// to a new thread when a continuation runs long; the writer role; the request timeouts' list.
    /// </summary>
    public partial class FakeServerTests
    {
        private static void NoHeartbeat(TicketingOptions o)
        {
            o.HeartbeatInterval = TimeSpan.Zero;
        }

        [Test]
        public void AContinuationRunsOnTheReaderThreadAndMayBlockOnAnotherAnswer()
        {
            TicketingClient c = Connect(NoHeartbeat); // which would replace a connection whose reader stopped reading
            string thread = null;
            Task<TicketingLock> acquire = c.AcquireAsync("a", TimeSpan.FromSeconds(30));
            // ExecuteSynchronously: it runs where the acquire's task completes. Blocking there on
            // another answer of the same connection (sync over async) would never end if that
            // thread had to read the answer itself.
            Task<TimeSpan> chained = acquire.ContinueWith(t =>
            {
                thread = Thread.CurrentThread.Name;
                return c.PingAsync().GetAwaiter().GetResult(); // the PING is answered by the fake server (AutoPing)
            }, TaskContinuationOptions.ExecuteSynchronously);
            Grant(_server.Expect(Op.Acquire), 7);
            Assert.GreaterOrEqual(Tasks.Result(chained), TimeSpan.Zero);
            StringAssert.StartsWith("Ticketing reader", thread);
            Assert.AreEqual(7UL, Tasks.Result(acquire).Token);
        }

        [Test]
        public void AContinuationThatWaitsForAnotherCallersAnswerDoesNotHoldItBack()
        {
            TicketingClient c = Connect(NoHeartbeat);
            var bAnswered = new ManualResetEventSlim();
            var aRunning = new ManualResetEventSlim();
            Task<TicketingLock> a = c.AcquireAsync("a", TimeSpan.FromSeconds(30));
            FakeServer.Received acqA = _server.Expect(Op.Acquire);
            Task<TicketingLock> b = c.AcquireAsync("b", TimeSpan.FromSeconds(30));
            FakeServer.Received acqB = _server.Expect(Op.Acquire);
            Task<bool> aDone = a.ContinueWith(t =>
            {
                aRunning.Set();
                return bAnswered.Wait(TimeSpan.FromSeconds(10)); // user code that blocks the thread it runs on
            }, TaskContinuationOptions.ExecuteSynchronously);
            Task bDone = b.ContinueWith(t => bAnswered.Set(), TaskContinuationOptions.ExecuteSynchronously);
            Grant(acqA, 1);
            Assert.IsTrue(aRunning.Wait(TimeSpan.FromSeconds(10)), "a's continuation runs");
            Grant(acqB, 2); // read by another thread: the watchdog gave it the reading
            Tasks.Ok(bDone);
            Assert.IsTrue(Tasks.Result(aDone), "b's answer arrived while a's continuation blocked");
        }

        [Test]
        public void AFrameQueuedInsideABatchThatThenBlocksIsStillSent()
        {
            TicketingClient c = Connect(NoHeartbeat);
            Task<TicketingLock> a = c.AcquireAsync("a", TimeSpan.FromSeconds(30));
            FakeServer.Received acqA = _server.Expect(Op.Acquire);
            Task<TicketingLock> b = c.AcquireAsync("b", TimeSpan.FromSeconds(30));
            FakeServer.Received acqB = _server.Expect(Op.Acquire);
            // a's continuation sends a PING while b's answer is still due in the same batch (the
            // reader keeps the frame to send it after the batch), then blocks on the PING's answer.
            Task<TimeSpan> aDone = a.ContinueWith(t => c.PingAsync().GetAwaiter().GetResult(), TaskContinuationOptions.ExecuteSynchronously);
            var bothAnswers = new List<byte>();
            bothAnswers.AddRange(new ResponseFrame(Op.Acquire, Status.Ok, acqA.Id, 1, acqA.Frame.LeaseMs, 0, null).Encode());
            bothAnswers.AddRange(new ResponseFrame(Op.Acquire, Status.Ok, acqB.Id, 2, acqB.Frame.LeaseMs, 0, null).Encode());
            acqA.Conn.SendRaw(bothAnswers.ToArray()); // one write: one batch for the reader
            Assert.GreaterOrEqual(Tasks.Result(aDone), TimeSpan.Zero);
            Assert.AreEqual(2UL, Tasks.Result(b).Token);
        }

        [Test]
        public void ManyCallersShareTheWriterAndEveryFrameArrivesInOrder()
        {
            TicketingClient c = Connect();
            const int n = 64;
            var pings = new Task<TimeSpan>[n];
            using (var go = new ManualResetEventSlim())
            {
                Task[] starters = Enumerable.Range(0, n).Select(i => Task.Run(() =>
                {
                    go.Wait();
                    pings[i] = c.PingAsync();
                })).ToArray();
                go.Set();
                Assert.IsTrue(Task.WaitAll(starters, Tasks.Bound));
            }
            foreach (Task<TimeSpan> p in pings)
            {
                Assert.GreaterOrEqual(Tasks.Result(p), TimeSpan.Zero);
            }
            // Ids are taken in the order frames are queued, and the writer keeps that order.
            Task<TicketingLock> x = c.AcquireAsync("x", TimeSpan.FromSeconds(5));
            Task<TicketingLock> y = c.AcquireAsync("y", TimeSpan.FromSeconds(5));
            FakeServer.Received first = _server.Expect(Op.Acquire);
            FakeServer.Received second = _server.Expect(Op.Acquire);
            Assert.Less(first.Id, second.Id);
            Grant(first, 1);
            Grant(second, 2);
            Assert.AreEqual(1UL, Tasks.Result(x).Token);
            Assert.AreEqual(2UL, Tasks.Result(y).Token);
        }

        [Test]
        public void RequestTimeoutsShareOneListAndAnAnsweredRequestLeavesIt()
        {
            TicketingClient c = Connect(o =>
            {
                o.RequestTimeout = TimeSpan.FromMilliseconds(300);
                o.HeartbeatInterval = TimeSpan.Zero;
            });
            // Answered (AutoPing): it leaves the list; nothing fires for it later.
            Assert.GreaterOrEqual(Tasks.Result(c.PingAsync()), TimeSpan.Zero);
            _server.AutoPing = false;
            Task<TimeSpan> first = c.PingAsync();
            _server.Expect(Op.Ping);
            Task<TicketingLock> once = c.TryAcquireAsync("k", TimeSpan.FromSeconds(5)); // wait 0: the request timeout only
            FakeServer.Received acq = _server.Expect(Op.Acquire);
            Assert.AreEqual(0U, acq.Frame.WaitMs);
            Task<TimeSpan> answered = c.PingAsync();
            FakeServer.Received ping = _server.Expect(Op.Ping);
            ping.Conn.Ok(ping.Frame);
            Assert.GreaterOrEqual(Tasks.Result(answered), TimeSpan.Zero);
            StringAssert.Contains("300 ms", Tasks.Failure<RequestTimeoutException>(first).Message);
            var e = Tasks.Failure<RequestTimeoutException>(once);
            StringAssert.Contains("ACQUIRE", e.Message);
            // The timed-out acquire is withdrawn, as any acquire its caller gave up.
            FakeServer.Received cancel = _server.Expect(Op.Cancel);
            Assert.AreEqual(acq.Id, cancel.Frame.Token);
        }

        [Test]
        public void CloseFailsCallsInFlightAndLeavesNoRequestTimer()
        {
            TicketingClient c = Connect(o => o.RequestTimeout = TimeSpan.FromSeconds(30));
            _server.AutoPing = false;
            Task<TimeSpan> ping = c.PingAsync();
            _server.Expect(Op.Ping);
            Tasks.Ok(c.CloseAsync());
            Tasks.Failure<ClosedException>(ping);
            Tasks.Failure<ClosedException>(c.PingAsync());
        }

        /// <summary>
        /// Fills the thread pool with work items that block until the returned gate is set: the
        /// pool is held to 2 threads to start with, every one of them blocks, and 64 more items
        /// queue behind, so a work item queued now waits until the pool has added threads for all
        /// of them (on Mono, seconds). Dispose the gate to let them all go and restore the pool.
        /// </summary>
        private static IDisposable SaturatePool()
        {
            int minWorkers, minIo;
            ThreadPool.GetMinThreads(out minWorkers, out minIo);
            ThreadPool.SetMinThreads(2, minIo);
            var gate = new ManualResetEvent(false); // a kernel wait: the blocked items do not spin
            int running = 0;
            for (int i = 0; i < 66; i++)
            {
                ThreadPool.UnsafeQueueUserWorkItem(_ =>
                {
                    Interlocked.Increment(ref running);
                    gate.WaitOne();
                }, null);
            }
            Poll.Until(TimeSpan.FromSeconds(5), () => Volatile.Read(ref running) >= 2, "pool threads blocked");
            return new Releaser(() =>
            {
                gate.Set();
                ThreadPool.SetMinThreads(minWorkers, minIo);
                Poll.Until(TimeSpan.FromSeconds(30), () => Volatile.Read(ref running) == 66, "the blocked work items ran");
            });
        }

        private sealed class Releaser : IDisposable
        {
            private readonly Action _release;

            internal Releaser(Action release)
            {
                _release = release;
            }

            public void Dispose()
            {
                _release();
            }
        }

        /// <summary>
        /// Expects four <paramref name="op"/> frames in a row, each within <paramref name="gapMs"/>
        /// of the one before (the first of when this is called), answering each.
        /// <paramref name="state"/> describes the client for a failure's message.
        /// </summary>
        private void ExpectSteadily(Op op, int gapMs, Action<FakeServer.Received> answer, Func<string> state)
        {
            for (int i = 0; i < 4; i++)
            {
                FakeServer.Received r = _server.Poll(gapMs);
                Assert.IsNotNull(r, op + " " + i + " did not reach the server within " + gapMs + " ms of the one before (" + state() + ")");
                Assert.AreEqual(op, r.Op, "expected " + op + ", got " + r.Op + " id " + r.Id);
                answer(r);
            }
        }

        [Test]
        public void KeepAliveExtendReachesTheServerWhileThePoolIsBusy()
        {
            // Keep-alive extends from the timer thread; its frame must not wait for a pool thread
            // (a late extend can lose a lock the application still holds). While the frame was
            // flushed from the pool, none came within 5 s.
            TicketingClient c = Connect(NoHeartbeat);
            TicketingLock l = Held(c, "k", 8, new AcquireOptions(TimeSpan.FromMilliseconds(1500)) { KeepAlive = true });
            using (SaturatePool())
            {
                // An extend every 500 ms (a third of the lease); 700 ms more for a busy machine, and
                // still well within the lease.
                ExpectSteadily(Op.Extend, 1200, ext => ext.Conn.Reply(ext.Frame, Status.Ok, 8, 1500), () => l.ToString());
                Assert.IsFalse(l.IsLost);
            }
        }

        [Test]
        public void HeartbeatPingReachesTheServerWhileThePoolIsBusy()
        {
            TicketingClient c = Connect(o => o.HeartbeatInterval = TimeSpan.FromMilliseconds(200));
            _server.AutoPing = false;
            using (SaturatePool())
            {
                // A PING after 200 ms of silence, checked every 200 ms: one every 400 ms at most;
                // 1.1 s more for a busy machine (while PINGs were flushed from the pool, none came
                // within 5 s).
                ExpectSteadily(Op.Ping, 1500, ping => ping.Conn.Ok(ping.Frame), () => "session " + c.SessionId);
            }
        }
    }

    /// <summary>The request timeouts' list (Request.cs) on its own.</summary>
    [TestFixture]
    [Timeout(30000)]
    public class TimeoutListTests
    {
        private static Request Ping()
        {
            return new Request(Op.Ping, null, 0, 0, 0, false);
        }

        [Test]
        public void DueRequestsComeOutInOrderAndRemovedOnesNever()
        {
            var mu = new object();
            var fired = new SemaphoreSlim(0);
            TimeoutList list = null;
            var taken = new List<Request>();
            list = new TimeoutList(() =>
            {
                lock (mu)
                {
                    List<Request> due = list.TakeDue();
                    if (due != null)
                    {
                        taken.AddRange(due);
                    }
                }
                fired.Release();
            });
            Request a = Ping(), b = Ping(), c = Ping(), later = Ping();
            lock (mu)
            {
                list.Add(a, 0);
                list.Add(b, 0);
                list.Add(c, 0);
                list.Add(later, 60000);
                b.CancelTimer(); // answered: out of the list
            }
            Assert.IsTrue(fired.Wait(TimeSpan.FromSeconds(10)), "the list's timer fired");
            lock (mu)
            {
                CollectionAssert.AreEqual(new[] { a, c }, taken);
                Assert.IsNull(a.Timeouts);
                Assert.AreSame(list, later.Timeouts);
                later.CancelTimer();
                Assert.IsNull(later.Timeouts);
                list.Add(a, 60000);
                list.Clear();
                Assert.IsNull(a.Timeouts);
            }
        }

        [Test]
        public void ARequestAddedAgainMovesToTheEnd()
        {
            var list = new TimeoutList(() => { });
            Request a = Ping(), b = Ping();
            list.Add(a, 60000);
            list.Add(b, 60000);
            list.Add(a, 60000); // its timeout starts again
            Assert.IsNull(b.TimeoutPrev);
            Assert.AreSame(a, b.TimeoutNext);
            Assert.AreSame(b, a.TimeoutPrev);
            Assert.IsNull(a.TimeoutNext);
            list.Clear();
        }
    }

    /// <summary>Many tasks on one client against the real server, and a close racing them.</summary>
    [TestFixture]
    [Timeout(60000)]
    public class RealServerThreadingTests : TestBase
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

        private TicketingClient Client()
        {
            return Closing(Tasks.Result(TicketingClient.ConnectAsync(_server.Endpoint)));
        }

        [Test]
        public void SixteenCallersTakeAndReleaseTheirKeysWithGrowingTokens()
        {
            TicketingClient c = Client();
            string prefix = "threads-" + Guid.NewGuid().ToString("N") + "-";
            Task<ulong>[] loops = Enumerable.Range(0, 16).Select(i => Task.Run(async () =>
            {
                ulong last = 0;
                for (int n = 0; n < 50; n++)
                {
                    TicketingLock l = await c.TryAcquireAsync(prefix + i, TimeSpan.FromSeconds(10)).ConfigureAwait(false);
                    Assert.IsNotNull(l, "an uncontended key is acquired");
                    Assert.Greater(l.Token, last, "fencing tokens grow");
                    last = l.Token;
                    await l.ReleaseAsync().ConfigureAwait(false);
                    Assert.IsTrue(l.IsReleased);
                }
                return last;
            })).ToArray();
            Assert.IsTrue(Task.WaitAll(loops, TimeSpan.FromSeconds(30)), "the callers finished");
            Assert.AreEqual(16, loops.Select(t => t.Result).Distinct().Count());
        }

        [Test]
        public void TlsCallsMadeWhileTheReaderWaitsAreSentAtOnce()
        {
            using (Certs certs = Certs.Make())
            using (ServerProcess s = ServerProcess.Start(new Dictionary<string, string>
            {
                { "TICKETING_TLS_CERT", certs.ServerCert },
                { "TICKETING_TLS_KEY", certs.ServerKey },
            }))
            {
                var o = new TicketingOptions
                {
                    Endpoints = new List<string> { s.Endpoint },
                    Tls = new TlsOptions { TrustedCertificates = TlsOptions.LoadCertificates(certs.Ca), ServerName = "localhost" },
                    HeartbeatInterval = TimeSpan.Zero, // which would replace a connection whose writes stalled
                };
                TicketingClient c = Closing(Tasks.Result(TicketingClient.ConnectAsync(o)));
                for (int i = 0; i < 3; i++)
                {
                    Thread.Sleep(200); // the connection reads, waiting for the server
                    // A write while the read waits must not wait for the read.
                    Tasks.Ok(Tasks.Result(c.AcquireAsync("tls-" + i, TimeSpan.FromSeconds(30))).ReleaseAsync());
                }
            }
        }

        [Test]
        public void DisposeRacingCallsEndsEveryCall()
        {
            for (int round = 0; round < 5; round++)
            {
                TicketingClient c = Client();
                string prefix = "race-" + Guid.NewGuid().ToString("N") + "-";
                int started = 0;
                Task[] loops = Enumerable.Range(0, 8).Select(i => Task.Run(async () =>
                {
                    while (true)
                    {
                        Interlocked.Increment(ref started);
                        TicketingLock l = await c.TryAcquireAsync(prefix + i, TimeSpan.FromSeconds(10)).ConfigureAwait(false);
                        if (l != null)
                        {
                            await l.ReleaseAsync().ConfigureAwait(false);
                        }
                    }
                })).ToArray();
                Poll.Until(TimeSpan.FromSeconds(10), () => Volatile.Read(ref started) > 40, "calls in flight");
                c.Dispose(); // from another thread than the callers', while their calls are in flight
                foreach (Task t in loops)
                {
                    Assert.IsTrue(((IAsyncResult)t).AsyncWaitHandle.WaitOne(Tasks.Bound), "a call still waits after the close");
                    Assert.IsTrue(t.IsFaulted, "the loop ends with the close's error");
                    Exception e = t.Exception.InnerException;
                    Assert.IsTrue(e is ClosedException || e is ConnectionLostException, "unexpected " + e);
                }
                Tasks.Failure<ClosedException>(c.PingAsync());
            }
        }
    }
}
