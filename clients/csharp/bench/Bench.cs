// The C# client's benchmark program (bench-run.sh runs it; the contract is in bench/README or the
// harness): one TicketingClient, N async callers (Task.Run loops on the thread pool), each taking
// its own key once (TryAcquireAsync, lease 10 s) and releasing it, again and again. 1 s of warm-up,
// then --seconds counted. Prints {"pairs_per_sec": R, "errors": E}; exits 1 when more than 1% of
// the calls failed.
using System;
using System.Diagnostics;
using System.Globalization;
using System.Threading;
using System.Threading.Tasks;
using Ticketing;

internal static class Bench
{
    private static volatile bool _stop;

    private static int Main(string[] args)
    {
        string addr = "127.0.0.1:7070";
        int callers = 1;
        double seconds = 5;
        string api = "async";
        for (int i = 0; i + 1 < args.Length; i += 2)
        {
            switch (args[i])
            {
                case "--addr": addr = args[i + 1]; break;
                case "--callers": callers = int.Parse(args[i + 1], CultureInfo.InvariantCulture); break;
                case "--seconds": seconds = double.Parse(args[i + 1], CultureInfo.InvariantCulture); break;
                case "--api": api = args[i + 1]; break;
                default:
                    Console.Error.WriteLine("bench: unknown argument " + args[i]);
                    return 2;
            }
        }
        if (callers < 1 || seconds <= 0 || api != "async")
        {
            Console.Error.WriteLine("bench: --callers >= 1, --seconds > 0, --api async");
            return 2;
        }
        ThreadPool.GetMinThreads(out int minWorkers, out int minIo);
        ThreadPool.SetMinThreads(Math.Max(minWorkers, Math.Min(callers, 64) + 4), minIo);

        TicketingClient client = TicketingClient.ConnectAsync(addr).GetAwaiter().GetResult();
        var pairs = new long[callers * 16]; // one padded slot per caller
        var errors = new long[callers * 16];
        var loops = new Task[callers];
        int pid = Process.GetCurrentProcess().Id;
        for (int c = 0; c < callers; c++)
        {
            int slot = c * 16;
            string key = "bench-csharp-" + pid + "-" + c;
            loops[c] = Task.Run(async () =>
            {
                TimeSpan lease = TimeSpan.FromSeconds(10);
                while (!_stop)
                {
                    try
                    {
                        TicketingLock l = await client.TryAcquireAsync(key, lease).ConfigureAwait(false);
                        if (l == null)
                        {
                            Volatile.Write(ref errors[slot], errors[slot] + 1);
                            continue;
                        }
                        await l.ReleaseAsync().ConfigureAwait(false);
                        Volatile.Write(ref pairs[slot], pairs[slot] + 1);
                    }
                    catch (Exception e)
                    {
                        if (errors[slot] == 0)
                        {
                            Console.Error.WriteLine("bench: " + e.Message);
                        }
                        Volatile.Write(ref errors[slot], errors[slot] + 1);
                    }
                }
            });
        }
        Thread.Sleep(1000);
        long p0 = Sum(pairs), e0 = Sum(errors);
        var sw = Stopwatch.StartNew();
        Thread.Sleep(TimeSpan.FromSeconds(seconds));
        long p1 = Sum(pairs), e1 = Sum(errors);
        double took = sw.Elapsed.TotalSeconds;
        _stop = true;
        Task.WaitAll(loops, 10000);
        long n = p1 - p0, errs = e1 - e0;
        Console.WriteLine("{\"pairs_per_sec\": " + (n / took).ToString("F1", CultureInfo.InvariantCulture) + ", \"errors\": " + errs + "}");
        client.Dispose();
        return errs > (n + errs) / 100 ? 1 : 0;
    }

    private static long Sum(long[] a)
    {
        long s = 0;
        for (int i = 0; i < a.Length; i += 16)
        {
            s += Volatile.Read(ref a[i]);
        }
        return s;
    }
}
