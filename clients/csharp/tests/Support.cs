using System;
using System.Collections.Generic;
using System.Diagnostics;
using System.IO;
using System.Linq;
using System.Runtime.InteropServices;
using System.Text;
using System.Text.RegularExpressions;
using System.Threading;
using System.Threading.Tasks;
using NUnit.Framework;

namespace Ticketing.Tests
{
    /// <summary>Where the repository is, and waits bounded by a deadline.</summary>
    internal static class Env
    {
        private static string _root;

        /// <summary>The repository root: <c>$TICKETING_REPO_ROOT</c>, else the first folder upwards with protocol/vectors.json.</summary>
        internal static string RepoRoot
        {
            get
            {
                if (_root != null)
                {
                    return _root;
                }
                string env = Environment.GetEnvironmentVariable("TICKETING_REPO_ROOT");
                if (!string.IsNullOrEmpty(env))
                {
                    return _root = Path.GetFullPath(env);
                }
                for (string d = Environment.CurrentDirectory; d != null; d = Path.GetDirectoryName(d))
                {
                    if (File.Exists(Path.Combine(d, "protocol", "vectors.json")))
                    {
                        return _root = d;
                    }
                }
                throw new InvalidOperationException("cannot find the repository root (set TICKETING_REPO_ROOT)");
            }
        }

        internal static string ProtocolFile(string name)
        {
            return Path.Combine(RepoRoot, "protocol", name);
        }
    }

    /// <summary>Polling with a deadline instead of bare sleeps.</summary>
    internal static class Poll
    {
        internal static void Until(TimeSpan timeout, Func<bool> condition, string what)
        {
            var sw = Stopwatch.StartNew();
            while (true)
            {
                if (condition())
                {
                    return;
                }
                if (sw.Elapsed > timeout)
                {
                    Assert.Fail("timed out after " + timeout.TotalMilliseconds + " ms waiting for " + what);
                }
                Thread.Sleep(10);
            }
        }

        internal static async Task UntilAsync(TimeSpan timeout, Func<Task<bool>> condition, string what)
        {
            var sw = Stopwatch.StartNew();
            while (true)
            {
                if (await condition())
                {
                    return;
                }
                if (sw.Elapsed > timeout)
                {
                    Assert.Fail("timed out after " + timeout.TotalMilliseconds + " ms waiting for " + what);
                }
                await Task.Delay(10);
            }
        }
    }

    /// <summary>Assertions on tasks, each bounded in time.</summary>
    internal static class Tasks
    {
        internal static readonly TimeSpan Bound = TimeSpan.FromSeconds(10);

        internal static T Result<T>(Task<T> t)
        {
            Done(t);
            return t.GetAwaiter().GetResult();
        }

        /// <summary>Waits for the task and rethrows its failure.</summary>
        internal static void Ok(Task t)
        {
            Done(t);
            t.GetAwaiter().GetResult();
        }

        internal static void Done(Task t)
        {
            Assert.IsTrue(((IAsyncResult)t).AsyncWaitHandle.WaitOne(Bound), "the task did not finish within " + Bound.TotalSeconds + " s");
        }

        /// <summary>Waits for the task to fail and returns its exception, asserting its type.</summary>
        internal static TException Failure<TException>(Task t)
            where TException : Exception
        {
            Done(t);
            Assert.IsTrue(t.IsFaulted || t.IsCanceled, "expected " + typeof(TException).Name + ", but the task succeeded");
            Exception e;
            try
            {
                t.GetAwaiter().GetResult();
                e = null;
            }
            catch (Exception x)
            {
                e = x;
            }
            Assert.IsInstanceOf<TException>(e, "expected " + typeof(TException).Name + ", got " + e);
            return (TException)e;
        }
    }

    /// <summary>
    /// The real server binary, started by the test on 127.0.0.1 with a free port and a fresh data
    /// directory, stopped by its PID. The binary is <c>$TICKETING_BIN</c>, else one built once per
    /// test run from the repository root.
    /// </summary>
    internal sealed class ServerProcess : IDisposable
    {
        private static readonly Regex Listening = new Regex("addr=\"?([0-9.:\\[\\]a-f]+):(\\d+)");
        private static readonly object BuildLock = new object();
        private static string _built;

        private readonly Dictionary<string, string> _env;
        private readonly string _dataDir;
        private Process _process;
        private readonly StringBuilder _log = new StringBuilder();

        private ServerProcess(Dictionary<string, string> env, string dataDir)
        {
            _env = env;
            _dataDir = dataDir;
        }

        internal int Port { get; private set; }

        internal string Endpoint => "127.0.0.1:" + Port;

        internal int Pid => _process.Id;

        internal string Log
        {
            get
            {
                lock (_log)
                {
                    return _log.ToString();
                }
            }
        }

        internal static ServerProcess Start(Dictionary<string, string> extraEnv = null)
        {
            var env = new Dictionary<string, string> { { "TICKETING_STARTUP_GRACE", "0" } };
            if (extraEnv != null)
            {
                foreach (var kv in extraEnv)
                {
                    env[kv.Key] = kv.Value;
                }
            }
            string dir = Path.Combine(Path.GetTempPath(), "ticketing-csharp-data-" + Guid.NewGuid().ToString("N"));
            Directory.CreateDirectory(dir);
            var s = new ServerProcess(env, dir);
            s.Launch("127.0.0.1:0");
            return s;
        }

        internal static string Binary()
        {
            string bin = Environment.GetEnvironmentVariable("TICKETING_BIN");
            if (!string.IsNullOrEmpty(bin))
            {
                return bin;
            }
            lock (BuildLock)
            {
                if (_built == null)
                {
                    string dir = Path.Combine(Path.GetTempPath(), "ticketing-csharp-bin-" + Guid.NewGuid().ToString("N"));
                    Directory.CreateDirectory(dir);
                    string outPath = Path.Combine(dir, "ticketing");
                    var psi = new ProcessStartInfo("go", "build -o " + outPath + " ./cmd/ticketing")
                    {
                        WorkingDirectory = Env.RepoRoot,
                        UseShellExecute = false,
                    };
                    using (Process p = Process.Start(psi))
                    {
                        if (!p.WaitForExit(300000) || p.ExitCode != 0)
                        {
                            throw new InvalidOperationException("go build ./cmd/ticketing failed in " + Env.RepoRoot);
                        }
                    }
                    _built = outPath;
                }
                return _built;
            }
        }

        private void Launch(string addr)
        {
            var psi = new ProcessStartInfo(Binary(), "server")
            {
                UseShellExecute = false,
                RedirectStandardError = true,
                RedirectStandardOutput = true,
            };
            foreach (string k in psi.EnvironmentVariables.Keys.Cast<string>().ToList())
            {
                if (k.StartsWith("TICKETING_", StringComparison.Ordinal) && k != "TICKETING_BIN")
                {
                    psi.EnvironmentVariables.Remove(k);
                }
            }
            foreach (var kv in _env)
            {
                psi.EnvironmentVariables[kv.Key] = kv.Value;
            }
            psi.EnvironmentVariables["TICKETING_ADDR"] = addr;
            psi.EnvironmentVariables["TICKETING_DATA_DIR"] = _dataDir;
            psi.EnvironmentVariables["TICKETING_ADMIN_ADDR"] = "off";
            var listening = new TaskCompletionSource<int>();
            _process = new Process { StartInfo = psi };
            _process.ErrorDataReceived += (sender, e) =>
            {
                if (e.Data == null)
                {
                    listening.TrySetException(new InvalidOperationException("server exited before listening:\n" + Log));
                    return;
                }
                lock (_log)
                {
                    _log.AppendLine(e.Data);
                }
                if (e.Data.Contains("msg=listening"))
                {
                    Match m = Listening.Match(e.Data);
                    if (m.Success)
                    {
                        listening.TrySetResult(int.Parse(m.Groups[2].Value));
                    }
                }
            };
            _process.OutputDataReceived += (sender, e) => { };
            _process.Start();
            _process.BeginErrorReadLine();
            _process.BeginOutputReadLine();
            if (!listening.Task.Wait(TimeSpan.FromSeconds(30)))
            {
                throw new InvalidOperationException("the server did not listen within 30 s:\n" + Log);
            }
            Port = listening.Task.Result;
        }

        internal bool IsAlive
        {
            get
            {
                try
                {
                    return !_process.HasExited;
                }
                catch (InvalidOperationException)
                {
                    return false;
                }
            }
        }

        [DllImport("libc", EntryPoint = "kill", SetLastError = true)]
        private static extern int SysKill(int pid, int sig);

        /// <summary>SIGTERM: a graceful stop.</summary>
        internal void Terminate()
        {
            SysKill(_process.Id, 15);
        }

        /// <summary>SIGKILL, waiting for the process to end.</summary>
        internal void Kill()
        {
            if (IsAlive)
            {
                SysKill(_process.Id, 9);
                _process.WaitForExit(10000);
            }
        }

        internal bool WaitForExit(int ms)
        {
            return _process.WaitForExit(ms);
        }

        /// <summary>Starts the server again on the same port and data directory (a new state id).</summary>
        internal void Restart()
        {
            Kill();
            Launch("127.0.0.1:" + Port);
        }

        public void Dispose()
        {
            Kill();
            try
            {
                Directory.Delete(_dataDir, true);
            }
            catch (IOException)
            {
                // best effort
            }
        }
    }

    /// <summary>Test certificates made at test time with the openssl CLI (no private key is committed).</summary>
    internal sealed class Certs : IDisposable
    {
        private Certs(string dir)
        {
            Dir = dir;
        }

        internal string Dir { get; }

        internal string Ca => Path.Combine(Dir, "ca.pem");

        internal string ServerCert => Path.Combine(Dir, "server.pem");

        internal string ServerKey => Path.Combine(Dir, "server.key");

        internal string ClientCa => Path.Combine(Dir, "client-ca.pem");

        internal string ClientCert => Path.Combine(Dir, "client.pem");

        /// <summary>PKCS#8 (<c>PRIVATE KEY</c>).</summary>
        internal string ClientKey => Path.Combine(Dir, "client.key");

        /// <summary>SEC1 (<c>EC PRIVATE KEY</c>).</summary>
        internal string ClientKeySec1 => Path.Combine(Dir, "client-sec1.key");

        /// <summary>Makes an ECDSA P-256 CA with a server certificate (localhost, 127.0.0.1, ::1), and a client certificate from a second CA.</summary>
        internal static Certs Make()
        {
            string d = Path.Combine(Path.GetTempPath(), "ticketing-csharp-certs-" + Guid.NewGuid().ToString("N"));
            Directory.CreateDirectory(d);
            File.WriteAllText(Path.Combine(d, "server.ext"), "subjectAltName=IP:127.0.0.1,IP:::1,DNS:localhost\n");
            File.WriteAllText(Path.Combine(d, "client.ext"), "extendedKeyUsage=clientAuth\n");
            const string ec = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
            Run(d, "req -x509 " + ec + " -keyout ca.key -out ca.pem -days 2 -subj /CN=ticketing-test-ca");
            Run(d, "req -x509 " + ec + " -keyout client-ca.key -out client-ca.pem -days 2 -subj /CN=ticketing-test-client-ca");
            Run(d, "req " + ec + " -keyout server.key -out server.csr -subj /CN=server");
            Run(d, "x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out server.pem -days 2 -extfile server.ext");
            Run(d, "req " + ec + " -keyout client.key -out client.csr -subj /CN=client");
            Run(d, "x509 -req -in client.csr -CA client-ca.pem -CAkey client-ca.key -CAcreateserial -out client.pem -days 2 -extfile client.ext");
            Run(d, "ec -in client.key -out client-sec1.key");
            return new Certs(d);
        }

        internal static void Run(string dir, string args)
        {
            var psi = new ProcessStartInfo("openssl", args)
            {
                WorkingDirectory = dir,
                UseShellExecute = false,
                RedirectStandardOutput = true,
                RedirectStandardError = true,
            };
            using (Process p = Process.Start(psi))
            {
                Task<string> err = p.StandardError.ReadToEndAsync();
                p.StandardOutput.ReadToEnd();
                if (!p.WaitForExit(60000) || p.ExitCode != 0)
                {
                    throw new InvalidOperationException("openssl " + args + " failed: " + err.Result);
                }
            }
        }

        public void Dispose()
        {
            try
            {
                Directory.Delete(Dir, true);
            }
            catch (IOException)
            {
                // best effort
            }
        }
    }

    /// <summary>Collects what a test opened and closes it in reverse order.</summary>
    public abstract class TestBase
    {
        private readonly List<IDisposable> _closeables = new List<IDisposable>();

        /// <summary>Closes everything the test registered.</summary>
        [TearDown]
        public void CloseAll()
        {
            List<IDisposable> all;
            lock (_closeables)
            {
                all = new List<IDisposable>(_closeables);
                _closeables.Clear();
            }
            for (int i = all.Count - 1; i >= 0; i--)
            {
                try
                {
                    all[i].Dispose();
                }
                catch (Exception e)
                {
                    Console.Error.WriteLine("teardown: " + e.Message);
                }
            }
        }

        internal T Closing<T>(T c)
            where T : IDisposable
        {
            lock (_closeables)
            {
                _closeables.Add(c);
            }
            return c;
        }
    }
}
