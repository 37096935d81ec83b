using System;
using System.Collections.Generic;
using System.Diagnostics;
using System.Threading;
using System.Threading.Tasks;
using NUnit.Framework;
using Ticketing.Threading;

namespace Ticketing.Tests
{
    /// <summary>
    /// The Medallion-shaped provider (Ticketing.Threading) against the real server, used as code
    /// written for Medallion uses it: through the interfaces only, except where a test says.
    /// </summary>
    [TestFixture]
    [Timeout(60000)]
    public class ProviderTests : TestBase
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
            var o = new TicketingOptions { Endpoints = new List<string> { _server.Endpoint } };
            return Closing(Tasks.Result(TicketingClient.ConnectAsync(o)));
        }

        private static T Wait<T>(ValueTask<T> t)
        {
            return Tasks.Result(t.AsTask());
        }

        [Test]
        public void HandleHoldsUntilDisposedAndExcludesOthers()
        {
            TicketingClient observer = Client();
            IDistributedLockProvider a = new TicketingDistributedLockProvider(Client());
            IDistributedLockProvider b = new TicketingDistributedLockProvider(Client());
            IDistributedLock la = a.CreateLock("provider-basic");
            Assert.AreEqual("provider-basic", la.Name);

            IDistributedSynchronizationHandle h = Wait(la.AcquireAsync());
            Assert.IsNotNull(h);
            Assert.IsFalse(h.HandleLostToken.IsCancellationRequested);
            Assert.IsTrue(h.HandleLostToken.CanBeCanceled);
            Assert.IsTrue(Tasks.Result(observer.InspectAsync("provider-basic")).Held);
            Assert.IsInstanceOf<TicketingLock>(h, "the handle is the TicketingLock, with its fencing token");
            ulong first = ((TicketingLock)h).Token;
            Assert.AreEqual(TicketingDistributedLockProvider.DefaultLease, ((TicketingLock)h).Lease);

            Assert.IsNull(Wait(b.CreateLock("provider-basic").TryAcquireAsync()), "one try, taken");
            Assert.IsNull(b.TryAcquireLock("provider-basic"), "the extension's sync form, taken");

            Tasks.Ok(h.DisposeAsync().AsTask());
            Assert.IsFalse(Tasks.Result(observer.InspectAsync("provider-basic")).Held, "released by DisposeAsync");

            using (IDistributedSynchronizationHandle again = b.TryAcquireLock("provider-basic"))
            {
                Assert.IsNotNull(again);
                Assert.Greater(((TicketingLock)again).Token, first, "fencing tokens grow");
            }
            Assert.IsFalse(Tasks.Result(observer.InspectAsync("provider-basic")).Held, "released by Dispose");

            using (IDistributedSynchronizationHandle sync = a.AcquireLock("provider-basic", TimeSpan.FromSeconds(5)))
            {
                Assert.IsNotNull(sync);
            }
            IDistributedSynchronizationHandle viaExt = Wait(a.AcquireLockAsync("provider-basic"));
            viaExt.Dispose();
            IDistributedSynchronizationHandle tryExt = Wait(a.TryAcquireLockAsync("provider-basic", TimeSpan.FromSeconds(1)));
            Assert.IsNotNull(tryExt);
            tryExt.Dispose();
        }

        [Test]
        public void WaitingAcquireIsGrantedAtTheRelease()
        {
            IDistributedLockProvider a = new TicketingDistributedLockProvider(Client());
            IDistributedLockProvider b = new TicketingDistributedLockProvider(Client());
            IDistributedSynchronizationHandle held = a.AcquireLock("provider-fifo");
            ValueTask<IDistributedSynchronizationHandle> waiting = b.CreateLock("provider-fifo").TryAcquireAsync(TimeSpan.FromSeconds(10));
            Thread.Sleep(100);
            Assert.IsFalse(waiting.IsCompleted, "waits while held");
            held.Dispose();
            IDistributedSynchronizationHandle got = Wait(waiting);
            Assert.IsNotNull(got, "granted at the release");
            got.Dispose();
        }

        [Test]
        public void TimeoutsAreMedallions()
        {
            IDistributedLockProvider a = new TicketingDistributedLockProvider(Client());
            IDistributedLockProvider b = new TicketingDistributedLockProvider(Client());
            using (a.AcquireLock("provider-timeout"))
            {
                IDistributedLock l = b.CreateLock("provider-timeout");
                var sw = Stopwatch.StartNew();
                Assert.IsNull(l.TryAcquire(TimeSpan.FromMilliseconds(200)), "TryAcquire: null after its timeout");
                Assert.GreaterOrEqual(sw.ElapsedMilliseconds, 150);

                var e = Assert.Throws<TimeoutException>(() => l.Acquire(TimeSpan.FromMilliseconds(100)));
                Assert.IsInstanceOf<NotAcquiredException>(e.InnerException);
                StringAssert.Contains("provider-timeout", e.Message);

                TimeoutException ae = Tasks.Failure<TimeoutException>(l.AcquireAsync(TimeSpan.Zero).AsTask());
                Assert.IsInstanceOf<NotAcquiredException>(ae.InnerException);
            }
        }

        [Test]
        public void CancellationWithdrawsTheWait()
        {
            TicketingClient observer = Client();
            IDistributedLockProvider a = new TicketingDistributedLockProvider(Client());
            IDistributedLockProvider b = new TicketingDistributedLockProvider(Client());
            using (a.AcquireLock("provider-cancel"))
            {
                using (var cts = new CancellationTokenSource())
                {
                    Task<IDistributedSynchronizationHandle> waiting = b.AcquireLockAsync("provider-cancel", null, cts.Token).AsTask();
                    Poll.Until(TimeSpan.FromSeconds(5), () => Tasks.Result(observer.InspectAsync("provider-cancel")).Waiters == 1, "one waiter");
                    cts.Cancel();
                    Tasks.Failure<OperationCanceledException>(waiting);
                    Assert.IsTrue(waiting.IsCanceled);
                }
                Poll.Until(TimeSpan.FromSeconds(5), () => Tasks.Result(observer.InspectAsync("provider-cancel")).Waiters == 0, "the wait withdrawn");
            }
            Assert.IsFalse(Tasks.Result(observer.InspectAsync("provider-cancel")).Held, "nothing held after the cancelled acquire");
        }

        [Test]
        public void OptionsApplyAndHandleLostTokenFiresWhenTheLeaseRunsOut()
        {
            // Without keep-alive, a lease of 300 ms: the handle's HandleLostToken is cancelled.
            var provider = new TicketingDistributedLockProvider(Client(), new AcquireOptions(TimeSpan.FromMilliseconds(300)) { ThrowOnLost = false, WaitTimeout = TimeSpan.Zero });
            TicketingDistributedLock l = provider.CreateLock("provider-lost");
            TicketingLock h = l.Acquire(TimeSpan.FromSeconds(5)); // the call's timeout wins over the options'
            Assert.AreEqual(TimeSpan.FromMilliseconds(300), h.Lease);
            IDistributedSynchronizationHandle handle = h;
            var lost = new ManualResetEventSlim();
            handle.HandleLostToken.Register(() => lost.Set());
            Assert.IsTrue(lost.Wait(TimeSpan.FromSeconds(5)), "HandleLostToken cancelled when the lease ran out");
            Assert.AreEqual(LostReason.Expired, h.LostReason);
            handle.Dispose(); // ThrowOnLost = false: no exception

            // The default provider keeps its lock alive: a lost handle would throw at dispose.
            var strict = new TicketingDistributedLockProvider(Client(), new AcquireOptions(TimeSpan.FromMilliseconds(200)));
            IDistributedSynchronizationHandle s = strict.AcquireLock("provider-lost-strict");
            Assert.IsTrue(s.HandleLostToken.WaitHandle.WaitOne(TimeSpan.FromSeconds(5)), "lost");
            Assert.Throws<LockLostException>(() => s.Dispose());
        }

        [Test]
        public void ArgumentsAreCheckedBeforeAnythingIsSent()
        {
            TicketingClient c = Client();
            var provider = new TicketingDistributedLockProvider(c);
            Assert.Throws<ArgumentNullException>(() => new TicketingDistributedLockProvider(null));
            Assert.Throws<ArgumentNullException>(() => new TicketingDistributedLockProvider(c, null));
            Assert.Throws<ArgumentOutOfRangeException>(() => new TicketingDistributedLockProvider(c, new AcquireOptions(TimeSpan.Zero)));
            Assert.Throws<ArgumentException>(() => provider.CreateLock(""));
            Assert.Throws<ArgumentNullException>(() => provider.CreateLock(null));
            Assert.Throws<ArgumentException>(() => provider.CreateLock(new string('k', 65536)));
            Assert.Throws<ArgumentNullException>(() => DistributedLockProviderExtensions.AcquireLock(null, "k"));
            IDistributedLock l = provider.CreateLock("provider-args");
            Assert.Throws<ArgumentOutOfRangeException>(() => l.TryAcquire(TimeSpan.FromMilliseconds(-5)));
            Assert.AreEqual("TicketingDistributedLock(\"provider-args\")", l.ToString());
        }
    }
}
