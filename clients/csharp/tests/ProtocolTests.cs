using System;
using System.Collections.Generic;
using System.Globalization;
using System.IO;
using System.Linq;
using System.Reflection;
using System.Text;
using NUnit.Framework;
using Ticketing.Conformance;
using Ticketing.Protocol;

namespace Ticketing.Tests
{
    /// <summary>Every entry of protocol/vectors.json, read at test time: encode and decode, both directions.</summary>
    [TestFixture]
    public class VectorsTests
    {
        private static Dictionary<string, object> _vectors;

        private static Dictionary<string, object> Vectors
        {
            get
            {
                if (_vectors == null)
                {
                    _vectors = (Dictionary<string, object>)Json.Parse(File.ReadAllText(Env.ProtocolFile("vectors.json")));
                }
                return _vectors;
            }
        }

        private static IEnumerable<TestCaseData> Cases(string list)
        {
            foreach (Dictionary<string, object> v in ((List<object>)Vectors[list]).Cast<Dictionary<string, object>>())
            {
                yield return new TestCaseData(v).SetName(list + "/" + (string)v["name"]);
            }
        }

        /// <summary>The request vectors.</summary>
        public static IEnumerable<TestCaseData> Requests() => Cases("requests");

        /// <summary>The response vectors.</summary>
        public static IEnumerable<TestCaseData> Responses() => Cases("responses");

        /// <summary>The handshake vectors.</summary>
        public static IEnumerable<TestCaseData> HandshakeFrames() => Cases("handshake");

        /// <summary>The auth vectors.</summary>
        public static IEnumerable<TestCaseData> AuthCases() => Cases("auth");

        /// <summary>The malformed frames.</summary>
        public static IEnumerable<TestCaseData> Malformed() => Cases("malformed");

        [Test]
        public void EveryListIsPresentAndNotEmpty()
        {
            foreach (string list in new[] { "requests", "responses", "handshake", "auth", "malformed" })
            {
                Assert.IsTrue(Vectors.ContainsKey(list), list);
                Assert.Greater(((List<object>)Vectors[list]).Count, 0, list);
            }
            Assert.AreEqual(1L, Vectors["version"]);
        }

        [TestCaseSource("Requests")]
        public void RequestEncodesAndDecodes(Dictionary<string, object> v)
        {
            var f = (Dictionary<string, object>)v["fields"];
            byte[] wire = Hex((string)v["hex"]);
            var frame = new RequestFrame(OpOf(f["op"]), U64(f["id"]), U64(f["token"]), U32(f["lease_ms"]), U32(f["wait_ms"]), Hex((string)f["key_hex"]), (byte)(long)f["flags"]);
            Assert.AreEqual(ToHex(wire), ToHex(frame.Encode()), "encode");

            RequestFrame d = RequestFrame.Decode(wire, 0, wire.Length, Wire.MaxKeyLen);
            Assert.AreEqual(OpOf(f["op"]), d.Op);
            Assert.AreEqual((byte)(long)f["flags"], d.Flags);
            Assert.AreEqual(U64(f["id"]), d.RequestId);
            Assert.AreEqual(U64(f["token"]), d.Token);
            Assert.AreEqual(U32(f["lease_ms"]), d.LeaseMs);
            Assert.AreEqual(U32(f["wait_ms"]), d.WaitMs);
            Assert.AreEqual((string)f["key_hex"], ToHex(d.Key));
        }

        [TestCaseSource("Responses")]
        public void ResponseEncodesAndDecodes(Dictionary<string, object> v)
        {
            var f = (Dictionary<string, object>)v["fields"];
            byte[] wire = Hex((string)v["hex"]);
            var frame = new ResponseFrame(OpOf(f["op"]), StatusOf(f["status"]), U64(f["id"]), U64(f["token"]), U32(f["lease_ms"]), U32(f["detail"]), Hex((string)f["data_hex"]));
            Assert.AreEqual(ToHex(wire), ToHex(frame.Encode()), "encode");

            ResponseFrame d = ResponseFrame.Decode(wire, 0, wire.Length, Wire.MaxDataLen);
            Assert.AreEqual(OpOf(f["op"]), d.Op);
            Assert.AreEqual(StatusOf(f["status"]), d.Status);
            Assert.AreEqual(U64(f["id"]), d.RequestId);
            Assert.AreEqual(U64(f["token"]), d.Token);
            Assert.AreEqual(U32(f["lease_ms"]), d.LeaseMs);
            Assert.AreEqual(U32(f["detail"]), d.Detail);
            Assert.AreEqual((string)f["data_hex"], ToHex(d.Data));
        }

        [TestCaseSource("HandshakeFrames")]
        public void HandshakeFrameEncodesAndDecodes(Dictionary<string, object> v)
        {
            byte[] wire = Hex((string)v["hex"]);
            string op = (string)v["op"];
            byte[] encoded;
            switch (op)
            {
                case "HELLO":
                    {
                        Assert.AreEqual("client->server", v["direction"]);
                        var h = new HelloFrame((byte)(long)v["version"], (ushort)(long)v["flags"], Hex((string)v["session_id_hex"]), Hex((string)v["nonce_hex"]));
                        encoded = h.Encode();
                        HelloFrame d = HelloFrame.Decode(wire);
                        Assert.AreEqual((long)v["version"], d.Version);
                        Assert.AreEqual((long)v["flags"], d.Flags);
                        Assert.AreEqual(v["session_id_hex"], ToHex(d.SessionId));
                        Assert.AreEqual(v["nonce_hex"], ToHex(d.ClientNonce));
                        break;
                    }
                case "CHALLENGE":
                    {
                        Assert.AreEqual("server->client", v["direction"]);
                        var c = new ChallengeFrame(StatusOf(v["status"]), (byte)(long)v["version"], (byte)(long)v["flags"], U32(v["detail"]), Hex(Zero((string)v["nonce_hex"], Wire.Nonce)), Hex((string)v["data_hex"]));
                        encoded = c.Encode();
                        ChallengeFrame d = ChallengeFrame.Decode(wire);
                        Assert.AreEqual(StatusOf(v["status"]), d.Status);
                        Assert.AreEqual((long)v["version"], d.Version);
                        Assert.AreEqual((long)v["flags"], d.Flags);
                        Assert.AreEqual(((long)v["flags"] & Wire.ChallengeAuthRequired) != 0, d.AuthRequired);
                        Assert.AreEqual(U32(v["detail"]), d.Detail);
                        Assert.AreEqual(Zero((string)v["nonce_hex"], Wire.Nonce), ToHex(d.ServerNonce));
                        Assert.AreEqual(v["data_hex"], ToHex(d.Data));
                        break;
                    }
                case "AUTH":
                    {
                        Assert.AreEqual("client->server", v["direction"]);
                        byte[] proof = Hex(Zero((string)v["proof_hex"], Wire.Proof));
                        encoded = new AuthFrame(proof).Encode();
                        Assert.AreEqual(ToHex(proof), ToHex(AuthFrame.Decode(wire).ClientProof));
                        break;
                    }
                case "WELCOME":
                    {
                        Assert.AreEqual("server->client", v["direction"]);
                        var w = new WelcomeFrame(StatusOf(v["status"]), (byte)(long)v["flags"], U32(v["detail"]), U32(v["session_grace_ms"]),
                            Hex(Zero((string)v["state_id_hex"], Wire.StateId)), Hex(Zero((string)v["proof_hex"], Wire.Proof)));
                        encoded = w.Encode();
                        WelcomeFrame d = WelcomeFrame.Decode(wire);
                        Assert.AreEqual(StatusOf(v["status"]), d.Status);
                        Assert.AreEqual((long)v["flags"], d.Flags);
                        Assert.AreEqual(((long)v["flags"] & Wire.WelcomeResumed) != 0, d.Resumed);
                        Assert.AreEqual(U32(v["detail"]), d.Detail);
                        Assert.AreEqual(U32(v["session_grace_ms"]), d.SessionGraceMs);
                        Assert.AreEqual(Zero((string)v["state_id_hex"], Wire.StateId), ToHex(d.StateId));
                        Assert.AreEqual(Zero((string)v["proof_hex"], Wire.Proof), ToHex(d.ServerProof));
                        break;
                    }
                default:
                    Assert.Fail("unknown handshake op " + op);
                    return;
            }
            Assert.AreEqual(ToHex(wire), ToHex(encoded), "encode");
        }

        [TestCaseSource("AuthCases")]
        public void AuthProofsMatch(Dictionary<string, object> v)
        {
            byte[] token = Encoding.UTF8.GetBytes((string)v["token_utf8"]);
            byte[] sid = Hex((string)v["session_id_hex"]);
            byte[] cn = Hex((string)v["client_nonce_hex"]);
            byte[] sn = Hex((string)v["server_nonce_hex"]);
            Assert.AreEqual(v["client_proof_hex"], ToHex(Handshake.ClientProof(token, sid, cn, sn)), "client proof");
            var w = new WelcomeFrame(Status.Ok, (byte)(long)v["welcome_flags"], 0, U32(v["session_grace_ms"]), Hex((string)v["state_id_hex"]), null);
            byte[] server = Handshake.ServerProof(token, sid, cn, sn, w.ProofInput());
            Assert.AreEqual(v["server_proof_hex"], ToHex(server), "server proof");
            Assert.AreEqual(27, w.ProofInput().Length);
            Assert.IsTrue(Handshake.ProofsEqual(server, Hex((string)v["server_proof_hex"])));
            byte[] wrong = (byte[])server.Clone();
            wrong[31] ^= 1;
            Assert.IsFalse(Handshake.ProofsEqual(wrong, server), "one bit differs");
            Assert.IsFalse(Handshake.ProofsEqual(server, new byte[31]), "lengths differ");
            Assert.IsFalse(Handshake.ProofsEqual(Handshake.ClientProof(Encoding.UTF8.GetBytes("other token"), sid, cn, sn), Hex((string)v["client_proof_hex"])));
        }

        [TestCaseSource("Malformed")]
        public void MalformedFrameIsRejected(Dictionary<string, object> v)
        {
            byte[] b = Hex((string)v["hex"]);
            int max = (int)(long)v["max_var"];
            string kind = (string)v["kind"];
            var expected = (string)v["error"] == "short" ? FrameError.Short : (string)v["error"] == "length" ? FrameError.Length : FrameError.TooLarge;
            FrameException e = Assert.Throws<FrameException>(() =>
            {
                if (kind == "request")
                {
                    RequestFrame.Decode(b, 0, b.Length, max);
                }
                else
                {
                    ResponseFrame.Decode(b, 0, b.Length, max);
                }
            });
            Assert.AreEqual(expected, e.Error, e.Message);
            if (expected == FrameError.TooLarge)
            {
                // detected from the first 4 bytes alone
                Assert.Throws<FrameException>(() => Frames.FrameSize(b, 0, 4, max));
            }
            if (expected == FrameError.Short && b.Length >= 4)
            {
                Assert.Greater(Frames.FrameSize(b, 0, b.Length, max), b.Length, "the length asks for more bytes");
            }
        }

        [Test]
        public void DecoderFindsFramesBackToBackInOneBuffer()
        {
            var list = ((List<object>)Vectors["responses"]).Cast<Dictionary<string, object>>().ToList();
            var all = new MemoryStream();
            foreach (var v in list)
            {
                byte[] b = Hex((string)v["hex"]);
                all.Write(b, 0, b.Length);
            }
            byte[] buf = all.ToArray();
            int at = 0;
            int n = 0;
            while (at < buf.Length)
            {
                int size = Frames.FrameSize(buf, at, buf.Length - at, Wire.MaxDataLen);
                ResponseFrame f = ResponseFrame.Decode(buf, at, size, Wire.MaxDataLen);
                Assert.AreEqual(list[n]["hex"], ToHex(f.Encode()));
                at += size;
                n++;
            }
            Assert.AreEqual(list.Count, n);
        }

        [Test]
        public void EveryHexDumpInProtocolMdIsAVector()
        {
            string md = File.ReadAllText(Path.Combine(Env.RepoRoot, "PROTOCOL.md"));
            var named = new Dictionary<string, string>();
            foreach (string list in new[] { "requests", "responses", "handshake" })
            {
                foreach (Dictionary<string, object> v in ((List<object>)Vectors[list]).Cast<Dictionary<string, object>>())
                {
                    named[list + "/" + v["name"]] = (string)v["hex"];
                }
            }
            int seen = 0;
            int at = 0;
            while ((at = md.IndexOf("<!-- vector ", at, StringComparison.Ordinal)) >= 0)
            {
                int end = md.IndexOf(" -->", at, StringComparison.Ordinal);
                string name = md.Substring(at + 12, end - at - 12);
                int open = md.IndexOf("```", end, StringComparison.Ordinal);
                int close = md.IndexOf("```", open + 3, StringComparison.Ordinal);
                var hex = new StringBuilder();
                foreach (string line in md.Substring(open + 3, close - open - 3).Split('\n'))
                {
                    string[] parts = line.Trim().Split(new[] { ' ' }, StringSplitOptions.RemoveEmptyEntries);
                    for (int i = 1; i < parts.Length; i++)
                    {
                        hex.Append(parts[i]);
                    }
                }
                Assert.IsTrue(named.ContainsKey(name), "PROTOCOL.md names an unknown vector " + name);
                Assert.AreEqual(named[name], hex.ToString(), name);
                seen++;
                at = close;
            }
            Assert.Greater(seen, 40);
        }

        internal static Op OpOf(object name)
        {
            string s = (string)name;
            if (s.StartsWith("0x", StringComparison.Ordinal))
            {
                return (Op)byte.Parse(s.Substring(2), NumberStyles.HexNumber, CultureInfo.InvariantCulture);
            }
            return (Op)Enum.Parse(typeof(Op), ConstantsTests.Pascal(s));
        }

        internal static Status StatusOf(object name)
        {
            string s = (string)name;
            return s.Length == 0 ? Status.Ok : (Status)Enum.Parse(typeof(Status), ConstantsTests.Pascal(s));
        }

        private static ulong U64(object v)
        {
            return v is string ? ulong.Parse((string)v, CultureInfo.InvariantCulture) : (ulong)(long)v;
        }

        private static uint U32(object v)
        {
            return v is string ? uint.Parse((string)v, CultureInfo.InvariantCulture) : (uint)(long)v;
        }

        private static string Zero(string hex, int n)
        {
            return string.IsNullOrEmpty(hex) ? new string('0', 2 * n) : hex;
        }

        internal static byte[] Hex(string hex)
        {
            byte[] b = new byte[hex.Length / 2];
            for (int i = 0; i < b.Length; i++)
            {
                b[i] = byte.Parse(hex.Substring(2 * i, 2), NumberStyles.HexNumber, CultureInfo.InvariantCulture);
            }
            return b;
        }

        internal static string ToHex(byte[] b)
        {
            return BitConverter.ToString(b).Replace("-", "").ToLowerInvariant();
        }
    }

    /// <summary>The client's code tables against protocol/constants.json, in both directions.</summary>
    [TestFixture]
    public class ConstantsTests
    {
        private static Dictionary<string, object> Constants()
        {
            return (Dictionary<string, object>)Json.Parse(File.ReadAllText(Env.ProtocolFile("constants.json")));
        }

        /// <summary>"WAITERS_PER_KEY" as a C# name: "WaitersPerKey".</summary>
        internal static string Pascal(string upper)
        {
            var sb = new StringBuilder();
            foreach (string part in upper.Split('_'))
            {
                if (part.Length > 0)
                {
                    sb.Append(char.ToUpperInvariant(part[0])).Append(part.Substring(1).ToLowerInvariant());
                }
            }
            return sb.ToString();
        }

        [TestCase("ops", typeof(Op))]
        [TestCase("statuses", typeof(Status))]
        [TestCase("invalid_fields", typeof(InvalidField))]
        [TestCase("busy_limits", typeof(BusyLimit))]
        [TestCase("expired_reasons", typeof(ExpiredReason))]
        [TestCase("goaway_reasons", typeof(GoawayReason))]
        [TestCase("inspect_flags", typeof(InspectFlags))]
        public void CodeTableMatches(string table, Type type)
        {
            var entries = ((List<object>)Constants()[table]).Cast<Dictionary<string, object>>().ToList();
            Assert.Greater(entries.Count, 0);
            var names = new HashSet<string>();
            foreach (var e in entries)
            {
                string name = Pascal((string)e["name"]);
                names.Add(name);
                Assert.IsTrue(Enum.IsDefined(type, name), table + ": " + e["name"] + " is missing from " + type.Name);
                object value = Enum.Parse(type, name);
                Assert.AreEqual((long)e["value"], Convert.ToInt64(value, CultureInfo.InvariantCulture), table + ": " + e["name"]);
            }
            foreach (string member in Enum.GetNames(type))
            {
                if (type == typeof(InspectFlags) && member == "None")
                {
                    continue;
                }
                Assert.IsTrue(names.Contains(member), type.Name + "." + member + " is not in constants.json " + table);
            }
        }

        [TestCase("sizes")]
        [TestCase("client_rules")]
        public void SizesAndRulesMatch(string table)
        {
            var entries = (Dictionary<string, object>)Constants()[table];
            Assert.Greater(entries.Count, 0);
            foreach (var kv in entries)
            {
                FieldInfo f = typeof(Wire).GetField(Pascal(kv.Key), BindingFlags.Public | BindingFlags.Static);
                Assert.IsNotNull(f, table + ": Wire." + Pascal(kv.Key) + " is missing");
                Assert.AreEqual((long)kv.Value, Convert.ToInt64(f.GetValue(null), CultureInfo.InvariantCulture), table + ": " + kv.Key);
            }
        }

        [Test]
        public void ProtocolVersionMatches()
        {
            Assert.AreEqual((long)Constants()["version"], (long)Wire.Version);
        }
    }
}
