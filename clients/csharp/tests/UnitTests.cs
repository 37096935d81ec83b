using System;
using System.Diagnostics;
using System.IO;
using System.Linq;
using System.Security.Cryptography.X509Certificates;
using System.Text;
using System.Text.RegularExpressions;
using NUnit.Framework;

namespace Ticketing.Tests
{
    /// <summary>Pieces that need no server: endpoints, argument conversions, PEM and PKCS#12.</summary>
    [TestFixture]
    public class UnitTests
    {
        [TestCase("127.0.0.1:7070", "127.0.0.1", 7070)]
        [TestCase("locks.internal:1", "locks.internal", 1)]
        [TestCase("[::1]:65535", "::1", 65535)]
        [TestCase(" localhost:80 ", "localhost", 80)]
        public void EndpointsParse(string text, string host, int port)
        {
            Endpoint e = Endpoint.Parse(text);
            Assert.AreEqual(host, e.Host);
            Assert.AreEqual(port, e.Port);
            Assert.AreEqual(e, Endpoint.Parse(e.ToString()), "round trip");
        }

        [TestCase("nohost")]
        [TestCase(":7070")]
        [TestCase("h:0")]
        [TestCase("h:70000")]
        [TestCase("h:-1")]
        [TestCase("h:x")]
        [TestCase("::1:7070")]
        [TestCase("[::1]7070")]
        public void BadEndpointsAreRejected(string text)
        {
            Assert.Throws<ArgumentException>(() => Endpoint.Parse(text));
        }

        [Test]
        public void LeaseAndWaitConversions()
        {
            Assert.AreEqual(1u, Args.LeaseMs(TimeSpan.FromMilliseconds(1)));
            Assert.AreEqual(1u, Args.LeaseMs(TimeSpan.FromTicks(19999)), "whole milliseconds");
            Assert.AreEqual(uint.MaxValue, Args.LeaseMs(TimeSpan.FromMilliseconds(uint.MaxValue)));
            Assert.Throws<ArgumentOutOfRangeException>(() => Args.LeaseMs(TimeSpan.FromMilliseconds(1L << 32)));
            Assert.Throws<ArgumentOutOfRangeException>(() => Args.LeaseMs(TimeSpan.MinValue));
            Assert.AreEqual(Protocol.Wire.WaitForever, Args.WaitMs(null));
            Assert.AreEqual(Protocol.Wire.WaitForever, Args.WaitMs(System.Threading.Timeout.InfiniteTimeSpan));
            Assert.AreEqual(Protocol.Wire.WaitForever, Args.WaitMs(TimeSpan.MaxValue));
            Assert.AreEqual(0u, Args.WaitMs(TimeSpan.Zero));
            Assert.AreEqual(250u, Args.WaitMs(TimeSpan.FromMilliseconds(250)));
            Assert.Throws<ArgumentOutOfRangeException>(() => Args.WaitMs(TimeSpan.FromMilliseconds(-5)));
            Assert.Throws<ArgumentOutOfRangeException>(() => Args.Token(0));
        }

        [Test]
        public void KeysPrintAsTextOrHex()
        {
            Assert.AreEqual("\"order-1234\"", Args.Printable(Encoding.UTF8.GetBytes("order-1234")));
            Assert.AreEqual("0x00ff10c3bc", Args.Printable(new byte[] { 0x00, 0xff, 0x10, 0xc3, 0xbc }));
            Assert.AreEqual("0x0a", Args.Printable(new byte[] { 0x0a }), "control characters as hex");
            // Keys in messages are cut to 64 bytes, with their length (never a whole 5,000-byte key).
            Assert.AreEqual("\"" + new string('a', 64) + "\"\u2026(300 bytes)", Args.Printable(Encoding.UTF8.GetBytes(new string('a', 300))));
            Assert.AreEqual("\"" + new string('a', 64) + "\"", Args.Printable(Encoding.UTF8.GetBytes(new string('a', 64))));
            Assert.AreEqual("0x" + string.Concat(Enumerable.Repeat("ff", 64)) + "\u2026(5000 bytes)", Args.Printable(Enumerable.Repeat((byte)0xff, 5000).ToArray()));
            // A cut never splits a character: 63 bytes of "a" and a 2-byte "\u00e9" stop before it.
            string accented = new string('a', 63) + "\u00e9\u00e9";
            Assert.AreEqual("\"" + new string('a', 63) + "\"\u2026(67 bytes)", Args.Printable(Encoding.UTF8.GetBytes(accented)));
            Assert.AreEqual("ü", Args.Text(new byte[] { 0xc3, 0xbc }));
        }

        [Test]
        public void LostReasonsHaveTheSharedNames()
        {
            CollectionAssert.AreEqual(
                new[] { "expired", "not held", "server restarted", "server stopping" },
                Enum.GetValues(typeof(LostReason)).Cast<LostReason>().Select(r => r.ToText()));
        }

        [Test]
        public void OptionsValidateAndCopy()
        {
            var o = new TicketingOptions();
            CollectionAssert.IsEmpty(o.Endpoints, "empty: the default endpoint");
            Assert.AreEqual("127.0.0.1:7070", o.Validate().Endpoints.Single().ToString());
            Assert.AreEqual(TimeSpan.FromSeconds(5), o.ConnectTimeout);
            Assert.AreEqual(TimeSpan.FromSeconds(10), o.RequestTimeout);
            Assert.AreEqual(TimeSpan.FromSeconds(2), o.HeartbeatInterval);
            Assert.AreEqual(TimeSpan.FromMilliseconds(50), o.ReconnectBackoffMin);
            Assert.AreEqual(TimeSpan.FromSeconds(2), o.ReconnectBackoffMax);
            Assert.AreEqual(TimeSpan.FromSeconds(5), o.CleanupTimeout);
            Assert.IsFalse(o.ReleaseOnClose);
            Assert.IsNull(o.Token);
            Assert.IsNull(o.Tls);
            var one = new TicketingOptions { Endpoints = { "h:1" } };
            Assert.AreEqual("h:1", one.Validate().Endpoints.Single().ToString(), "an initializer names exactly its endpoints");
            TicketingOptions copy = one.Clone();
            copy.Endpoints.Add("x:1");
            Assert.AreEqual(1, one.Endpoints.Count, "a clone does not share the endpoint list");
            Assert.Throws<ArgumentException>(() => new TicketingOptions { Endpoints = { "h:1", "bad" } }.Validate());
            Assert.Throws<ArgumentOutOfRangeException>(() => new TicketingOptions { HeartbeatInterval = TimeSpan.FromSeconds(-1) }.Validate());
            Assert.Throws<ArgumentOutOfRangeException>(() => new TicketingOptions { ReconnectBackoffMin = TimeSpan.FromSeconds(3) }.Validate());
            Assert.AreEqual(TimeSpan.Zero, new TicketingOptions { HeartbeatInterval = TimeSpan.Zero }.Validate().HeartbeatInterval);

            var a = new AcquireOptions(TimeSpan.FromSeconds(1));
            Assert.IsNull(a.WaitTimeout);
            Assert.IsFalse(a.KeepAlive);
            Assert.IsNull(a.MaxHold);
            Assert.IsFalse(a.RefuseHeld);
            Assert.IsTrue(a.ThrowOnLost);
        }

        [Test]
        public void PemClientCertificatesLoadWithTheirKeys()
        {
            using (Certs certs = Certs.Make())
            {
                Certs.Run(certs.Dir, "genrsa -traditional -out rsa.key 2048");
                Certs.Run(certs.Dir, "req -new -x509 -key rsa.key -out rsa.pem -days 2 -subj /CN=rsa-client");
                StringAssert.Contains("BEGIN RSA PRIVATE KEY", File.ReadAllText(Path.Combine(certs.Dir, "rsa.key")));
                StringAssert.Contains("BEGIN EC PRIVATE KEY", File.ReadAllText(certs.ClientKeySec1));
                StringAssert.Contains("BEGIN PRIVATE KEY", File.ReadAllText(certs.ClientKey));
                foreach (var pair in new[]
                {
                    Tuple.Create(certs.ClientCert, certs.ClientKey),
                    Tuple.Create(certs.ClientCert, certs.ClientKeySec1),
                    Tuple.Create(Path.Combine(certs.Dir, "rsa.pem"), Path.Combine(certs.Dir, "rsa.key")),
                })
                {
                    X509Certificate2 c = TlsOptions.LoadClientCertificate(pair.Item1, pair.Item2);
                    Assert.IsTrue(c.HasPrivateKey, pair.Item2);
                    StringAssert.Contains("client", c.Subject);
                }
                X509Certificate2Collection ca = TlsOptions.LoadCertificates(certs.Ca);
                Assert.AreEqual(1, ca.Count);
                StringAssert.Contains("ticketing-test-ca", ca[0].Subject);
                Assert.Throws<ArgumentException>(() => TlsOptions.LoadCertificates(certs.ClientKey));
                Assert.Throws<ArgumentException>(() => TlsOptions.LoadClientCertificate(certs.ClientCert, certs.Ca));
                Certs.Run(certs.Dir, "pkcs8 -topk8 -in client.key -out enc.key -passout pass:x");
                var enc = Assert.Throws<ArgumentException>(() => TlsOptions.LoadClientCertificate(certs.ClientCert, Path.Combine(certs.Dir, "enc.key")));
                StringAssert.Contains("encrypted", enc.Message);
            }
        }

        [Test]
        public void Pkcs12IsReadableByOpenssl()
        {
            using (Certs certs = Certs.Make())
            {
                byte[] cert = Pem.Blocks(File.ReadAllText(certs.ClientCert), "CERTIFICATE").First();
                byte[] key = Pem.PrivateKey(File.ReadAllText(certs.ClientKey), "client.key");
                File.WriteAllBytes(Path.Combine(certs.Dir, "built.p12"), Pkcs12.Build(cert, key, "pw"));
                // openssl checks the MAC and decrypts the key; a wrong password must fail
                Certs.Run(certs.Dir, "pkcs12 -in built.p12 -passin pass:pw -nodes -out roundtrip.pem");
                string pem = File.ReadAllText(Path.Combine(certs.Dir, "roundtrip.pem"));
                StringAssert.Contains("BEGIN CERTIFICATE", pem);
                StringAssert.Contains("BEGIN PRIVATE KEY", pem);
                Assert.Throws<InvalidOperationException>(() => Certs.Run(certs.Dir, "pkcs12 -in built.p12 -passin pass:wrong -nodes -out bad.pem"));
            }
        }
    }

    /// <summary>
    /// The README's examples, each compiled exactly as written there by mcs in a fresh folder that
    /// holds only the package's Ticketing.dll (<c>$TICKETING_CSHARP_PACKAGE</c>, the folder
    /// package.sh built, which test.sh sets; else the DLL under test), and run against a real server.
    /// </summary>
    [TestFixture]
    [Timeout(120000)]
    public class ReadmeExampleTests
    {
        private const string Start = "<!-- example:start";
        private const string End = "<!-- example:end -->";

        /// <summary>The code of every marked block of the README, in order.</summary>
        internal static string[] Examples()
        {
            string readme = File.ReadAllText(Path.Combine(Env.RepoRoot, "clients", "csharp", "README.md"));
            var found = new System.Collections.Generic.List<string>();
            for (int at = readme.IndexOf(Start, StringComparison.Ordinal); at >= 0; at = readme.IndexOf(Start, at + 1, StringComparison.Ordinal))
            {
                int end = readme.IndexOf(End, at, StringComparison.Ordinal);
                Assert.IsTrue(end > at, "README: an example:start without its example:end");
                string block = readme.Substring(at, end - at);
                int open = block.IndexOf("```csharp\n", StringComparison.Ordinal);
                Assert.IsTrue(open >= 0, "README: a marked example without a csharp block");
                open += 10;
                found.Add(block.Substring(open, block.LastIndexOf("```", StringComparison.Ordinal) - open));
            }
            return found.ToArray();
        }

        [Test]
        public void ReadmeHasBothExamples()
        {
            string[] examples = Examples();
            Assert.AreEqual(2, examples.Length, "the ten-line example and the lock provider's");
            StringAssert.Contains("class Example", examples[0]);
            StringAssert.Contains("class ProviderExample", examples[1]);
            StringAssert.Contains("IDistributedLockProvider", examples[1]);
        }

        [TestCase(0)]
        [TestCase(1)]
        public void ReadmeExampleRunsAsWrittenAgainstThePackage(int index)
        {
            string code = Examples()[index];
            string package = Environment.GetEnvironmentVariable("TICKETING_CSHARP_PACKAGE");
            string dll = string.IsNullOrEmpty(package) ? typeof(TicketingClient).Assembly.Location : Path.Combine(package, "Ticketing.dll");
            Assert.IsTrue(File.Exists(dll), dll + " is missing (package.sh builds it)");

            string dir = Path.Combine(Path.GetTempPath(), "csharp-readme-" + Guid.NewGuid().ToString("N"));
            Directory.CreateDirectory(dir);
            try
            {
                File.WriteAllText(Path.Combine(dir, "Example.cs"), code);
                File.Copy(dll, Path.Combine(dir, "Ticketing.dll"));
                string output;
                Assert.AreEqual(0, Run(dir, "mcs", "-langversion:7.2 -warnaserror+ -out:Example.exe -r:Ticketing.dll Example.cs", null, out output), "compiles: " + output);
                using (ServerProcess server = ServerProcess.Start())
                {
                    Assert.AreEqual(0, Run(dir, "mono", "Example.exe", server.Endpoint, out output), output);
                    Assert.IsTrue(Regex.IsMatch(output, "^holding report-2024 with fencing token [1-9][0-9]*\\s*$"), output);
                    using (TicketingClient c = TicketingClient.Connect(server.Endpoint))
                    {
                        Assert.IsFalse(Tasks.Result(c.InspectAsync("report-2024")).Held, "released by the example");
                    }
                }
            }
            finally
            {
                Directory.Delete(dir, true);
            }
        }

        private static int Run(string dir, string file, string args, string endpoint, out string output)
        {
            var psi = new ProcessStartInfo(file, args)
            {
                WorkingDirectory = dir,
                UseShellExecute = false,
                RedirectStandardOutput = true,
                RedirectStandardError = true,
            };
            if (endpoint != null)
            {
                psi.EnvironmentVariables["TICKETING_ENDPOINT"] = endpoint;
            }
            using (Process p = Process.Start(psi))
            {
                var err = p.StandardError.ReadToEndAsync();
                string o = p.StandardOutput.ReadToEnd();
                Assert.IsTrue(p.WaitForExit(60000), file + " did not finish");
                output = o + err.Result;
                return p.ExitCode;
            }
        }
    }
}
