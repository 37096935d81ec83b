using System;
using System.Collections.Generic;
using System.IO;
using System.Linq;
using System.Threading;
using System.Threading.Tasks;

namespace Ticketing.ExitCheck
{
    /// <summary>
    /// Runs 16 concurrent tasks of acquire/release on one client, disposes the client while they
    /// run (some hold a lock, some wait in a queue), lets them finish, and returns from Main: the
    /// process must exit 0. Mono once crashed at exit ("FATAL UNHANDLED EXCEPTION ... Failed to
    /// compare two elements in the array ---> ThreadAbortException" in its timer scheduler) when the
    /// client left System.Threading.Timers behind. Usage: ExitCheck.exe host:port [run-ms].
    /// </summary>
    internal static class Program
    {
        private static int Main(string[] args)
        {
            int runMs = args.Length > 1 ? int.Parse(args[1]) : 300;
            var client = TicketingClient.Connect(new TicketingOptions { Endpoints = new List<string> { args[0] } });
            string prefix = Guid.NewGuid().ToString("N").Substring(0, 8);
            int rounds = 0;
            Task[] tasks = Enumerable.Range(0, 16).Select(i => Task.Run(async () =>
            {
                try
                {
                    while (true)
                    {
                        TicketingLock l = await client.AcquireAsync(prefix + "-" + (i % 4), TimeSpan.FromSeconds(10), TimeSpan.FromSeconds(5)).ConfigureAwait(false);
                        Interlocked.Increment(ref rounds);
                        await l.ReleaseAsync().ConfigureAwait(false);
                    }
                }
                catch (ClosedException)
                {
                    // the client was closed under this task: the end of the run
                }
            })).ToArray();
            Thread.Sleep(runMs);
            client.Dispose();
            if (!Task.WaitAll(tasks, 10000))
            {
                Console.Error.WriteLine("exit-check: tasks still running 10 s after Dispose");
                return 2;
            }
            // Mono's timer scheduler thread ("Timer-Scheduler") starts with the first
            // System.Threading.Timer (Task.Delay and timed CancellationTokenSources use one). This
            // program makes none: the client must not either (its own TimerQueue serves it).
            bool scheduler = false;
            foreach (string t in Directory.GetDirectories("/proc/self/task"))
            {
                try
                {
                    scheduler |= File.ReadAllText(Path.Combine(t, "comm")).Trim() == "Timer-Scheduler";
                }
                catch (IOException)
                {
                    // the thread ended meanwhile
                }
            }
            Console.WriteLine("exit-check: " + rounds + " rounds; Mono timer scheduler thread: " + (scheduler ? "yes" : "no"));
            if (scheduler)
            {
                return 3;
            }
            return 0;
        }
    }
}
