using System;
using System.Collections.Generic;
using System.Diagnostics;
using System.Linq;
using System.Threading;
using System.Threading.Tasks;
using NUnit.Framework;

namespace Ticketing.Tests
{
    /// <summary>The client's one timer thread and its deadline heap (<see cref="TimerQueue"/>).</summary>
    [TestFixture]
    [Timeout(30000)]
    public class TimerQueueTests
    {
        [Test]
        public void EntriesRunInDueOrderAndCancelledOnesNever()
        {
            var q = new TimerQueue();
            var ran = new List<TimerEntry>();
            var all = new CountdownEvent(50);
            var rnd = new Random(7);
            var entries = new List<TimerEntry>();
            for (int i = 0; i < 100; i++)
            {
                TimerEntry e = null;
                Action act = () =>
                {
                    lock (ran)
                    {
                        ran.Add(e);
                    }
                    all.Signal();
                };
                lock (ran)
                {
                    e = q.Once(20 + rnd.Next(200), act);
                }
                entries.Add(e);
            }
            for (int i = 1; i < 100; i += 2)
            {
                entries[i].Dispose();
                entries[i].Dispose(); // idempotent
            }
            Assert.IsTrue(all.Wait(5000), "not every entry ran");
            Thread.Sleep(100);
            lock (ran)
            {
                Assert.AreEqual(50, ran.Count);
                Assert.IsFalse(ran.Any(e => entries.IndexOf(e) % 2 == 1), "a cancelled entry ran");
                for (int i = 1; i < ran.Count; i++)
                {
                    // (due times are taken when scheduled: compare those, not the delays)
                    Assert.LessOrEqual(ran[i - 1].Due, ran[i].Due, "out of due order");
                }
            }
            Assert.AreEqual(0, q.Count);
        }

        [Test]
        public void AnEarlierEntryWakesTheThread()
        {
            var q = new TimerQueue();
            q.Once(60000, () => { });
            var done = new ManualResetEventSlim();
            var sw = Stopwatch.StartNew();
            q.Once(50, done.Set);
            Assert.IsTrue(done.Wait(5000));
            Assert.That(sw.ElapsedMilliseconds, Is.InRange(45, 2000));
        }

        [Test]
        public void DelayCompletesOrIsCancelled()
        {
            var q = new TimerQueue();
            var sw = Stopwatch.StartNew();
            Tasks.Ok(q.Delay(TimeSpan.FromMilliseconds(100)));
            Assert.GreaterOrEqual(sw.ElapsedMilliseconds, 95);
            using (var cts = new CancellationTokenSource())
            {
                Task d = q.Delay(TimeSpan.FromMinutes(1), cts.Token);
                cts.Cancel();
                Tasks.Done(d);
                Assert.IsTrue(d.IsCanceled);
            }
            Assert.AreEqual(0, q.Count, "a cancelled delay leaves no entry");
        }

        [Test]
        public void WaitAsyncIsBoundedAndLeavesNoEntry()
        {
            var q = new TimerQueue();
            var never = new TaskCompletionSource<bool>();
            var sw = Stopwatch.StartNew();
            Assert.IsFalse(Tasks.Result(q.WaitAsync(never.Task, TimeSpan.FromMilliseconds(100))));
            Assert.GreaterOrEqual(sw.ElapsedMilliseconds, 95);
            var soon = new TaskCompletionSource<bool>();
            Task<bool> w = q.WaitAsync(soon.Task, TimeSpan.FromMinutes(1));
            soon.SetResult(true);
            Assert.IsTrue(Tasks.Result(w));
            Assert.AreEqual(0, q.Count, "the bound's entry is gone once the task completed");
        }

        [Test]
        public void AFailingActionDoesNotStopTheQueue()
        {
            var q = new TimerQueue();
            q.Once(10, () => { throw new InvalidOperationException("boom"); });
            var done = new ManualResetEventSlim();
            q.Once(30, done.Set);
            Assert.IsTrue(done.Wait(5000));
        }
    }
}
