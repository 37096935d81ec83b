using System;
using System.Collections.Generic;
using System.IO;
using System.Security.Cryptography;
using System.Text;

namespace Ticketing
{
    /// <summary>PEM blocks and private keys in the forms openssl writes.</summary>
    internal static class Pem
    {
        private const string EcPublicKeyOid = "1.2.840.10045.2.1";
        private const string RsaEncryptionOid = "1.2.840.113549.1.1.1";

        /// <summary>The DER bytes of every block with this label.</summary>
        internal static IEnumerable<byte[]> Blocks(string pem, string label)
        {
            string begin = "-----BEGIN " + label + "-----";
            string end = "-----END " + label + "-----";
            int at = 0;
            while (true)
            {
                int b = pem.IndexOf(begin, at, StringComparison.Ordinal);
                if (b < 0)
                {
                    yield break;
                }
                int e = pem.IndexOf(end, b, StringComparison.Ordinal);
                if (e < 0)
                {
                    throw new ArgumentException("PEM block " + label + " has no END line");
                }
                string body = pem.Substring(b + begin.Length, e - b - begin.Length);
                byte[] der;
                try
                {
                    der = Convert.FromBase64String(body.Replace("\r", "").Replace("\n", "").Replace(" ", ""));
                }
                catch (FormatException)
                {
                    throw new ArgumentException("PEM block " + label + " is not valid base64");
                }
                yield return der;
                at = e + end.Length;
            }
        }

        /// <summary>An unencrypted private key as PKCS#8 DER.</summary>
        internal static byte[] PrivateKey(string pem, string source)
        {
            foreach (byte[] der in Blocks(pem, "PRIVATE KEY"))
            {
                return der;
            }
            foreach (byte[] der in Blocks(pem, "EC PRIVATE KEY"))
            {
                return Sec1ToPkcs8(der, source);
            }
            foreach (byte[] der in Blocks(pem, "RSA PRIVATE KEY"))
            {
                return Der.Sequence(Der.Integer(0), Der.Sequence(Der.Oid(RsaEncryptionOid), Der.Null()), Der.OctetString(der));
            }
            if (pem.IndexOf("ENCRYPTED PRIVATE KEY", StringComparison.Ordinal) >= 0)
            {
                throw new ArgumentException(source + " holds an encrypted key; decrypt it first (openssl pkcs8 -nocrypt) or load a .pfx");
            }
            throw new ArgumentException("no PRIVATE KEY, EC PRIVATE KEY or RSA PRIVATE KEY block in " + source);
        }

        /// <summary>Wraps a SEC1 <c>ECPrivateKey</c> into PKCS#8 (its curve comes from its parameters).</summary>
        private static byte[] Sec1ToPkcs8(byte[] sec1, string source)
        {
            var outer = new Der.Reader(sec1);
            var seq = outer.Read(0x30);
            var fields = new Der.Reader(seq);
            fields.Read(0x02); // version 1
            fields.Read(0x04); // the private key
            byte[] curve = null;
            while (fields.HasMore)
            {
                byte tag = fields.PeekTag();
                byte[] value = fields.Read(tag);
                if (tag == 0xA0)
                {
                    curve = new Der.Reader(value).ReadTlv(0x06);
                }
            }
            if (curve == null)
            {
                throw new ArgumentException(source + ": the EC key names no curve; convert it to PKCS#8 (openssl pkcs8 -topk8 -nocrypt)");
            }
            return Der.Sequence(Der.Integer(0), Der.Sequence(Der.Oid(EcPublicKeyOid), curve), Der.OctetString(sec1));
        }

        internal static string RandomPassword()
        {
            byte[] b = new byte[16];
            using (var rng = RandomNumberGenerator.Create())
            {
                rng.GetBytes(b);
            }
            return Args.Hex(b);
        }
    }

    /// <summary>
    /// Builds a PKCS#12 (PFX) blob from a certificate and a PKCS#8 key, so that any .NET runtime
    /// (Mono's BoringSSL included) can load a PEM client certificate: the key shrouded with
    /// pbeWithSHAAnd3-KeyTripleDES-CBC, a SHA-1 MAC, as RFC 7292 describes.
    /// </summary>
    internal static class Pkcs12
    {
        private const int Iterations = 2048;
        private const string DataOid = "1.2.840.113549.1.7.1";
        private const string CertBagOid = "1.2.840.113549.1.12.10.1.3";
        private const string X509CertificateOid = "1.2.840.113549.1.9.22.1";
        private const string ShroudedKeyBagOid = "1.2.840.113549.1.12.10.1.2";
        private const string Pbe3DesOid = "1.2.840.113549.1.12.1.3";
        private const string LocalKeyIdOid = "1.2.840.113549.1.9.21";
        private const string Sha1Oid = "1.3.14.3.2.26";

        internal static byte[] Build(byte[] certDer, byte[] pkcs8, string password)
        {
            byte[] keyId;
            using (var sha = SHA1.Create())
            {
                keyId = sha.ComputeHash(certDer);
            }
            byte[] attributes = Der.Set(Der.Sequence(Der.Oid(LocalKeyIdOid), Der.Set(Der.OctetString(keyId))));

            byte[] certBag = Der.Sequence(
                Der.Oid(CertBagOid),
                Der.Explicit(0, Der.Sequence(Der.Oid(X509CertificateOid), Der.Explicit(0, Der.OctetString(certDer)))),
                attributes);

            byte[] salt = Salt();
            byte[] key = Derive(password, salt, 1, 24);
            byte[] iv = Derive(password, salt, 2, 8);
            byte[] encrypted;
            using (var des = TripleDES.Create())
            {
                des.Mode = CipherMode.CBC;
                des.Padding = PaddingMode.PKCS7;
                using (var enc = des.CreateEncryptor(key, iv))
                {
                    encrypted = enc.TransformFinalBlock(pkcs8, 0, pkcs8.Length);
                }
            }
            byte[] keyBag = Der.Sequence(
                Der.Oid(ShroudedKeyBagOid),
                Der.Explicit(0, Der.Sequence(
                    Der.Sequence(Der.Oid(Pbe3DesOid), Der.Sequence(Der.OctetString(salt), Der.Integer(Iterations))),
                    Der.OctetString(encrypted))),
                attributes);

            byte[] authSafe = Der.Sequence(Data(Der.Sequence(certBag)), Data(Der.Sequence(keyBag)));

            byte[] macSalt = Salt();
            byte[] mac;
            using (var hmac = new HMACSHA1(Derive(password, macSalt, 3, 20)))
            {
                mac = hmac.ComputeHash(authSafe);
            }
            byte[] macData = Der.Sequence(
                Der.Sequence(Der.Sequence(Der.Oid(Sha1Oid), Der.Null()), Der.OctetString(mac)),
                Der.OctetString(macSalt),
                Der.Integer(Iterations));
            return Der.Sequence(Der.Integer(3), Data(authSafe), macData);
        }

        private static byte[] Data(byte[] content)
        {
            return Der.Sequence(Der.Oid(DataOid), Der.Explicit(0, Der.OctetString(content)));
        }

        private static byte[] Salt()
        {
            byte[] s = new byte[8];
            using (var rng = RandomNumberGenerator.Create())
            {
                rng.GetBytes(s);
            }
            return s;
        }

        /// <summary>The PKCS#12 key derivation (RFC 7292, appendix B.2) with SHA-1.</summary>
        internal static byte[] Derive(string password, byte[] salt, byte id, int n)
        {
            const int u = 20;
            const int v = 64;
            byte[] pw = new byte[(password.Length + 1) * 2]; // BMPString with a terminating zero
            Encoding.BigEndianUnicode.GetBytes(password, 0, password.Length, pw, 0);
            byte[] d = new byte[v];
            for (int i = 0; i < v; i++)
            {
                d[i] = id;
            }
            byte[] s = Repeat(salt, v * ((salt.Length + v - 1) / v));
            byte[] p = Repeat(pw, v * ((pw.Length + v - 1) / v));
            byte[] ib = new byte[s.Length + p.Length];
            Buffer.BlockCopy(s, 0, ib, 0, s.Length);
            Buffer.BlockCopy(p, 0, ib, s.Length, p.Length);
            byte[] result = new byte[n];
            int done = 0;
            using (var sha = SHA1.Create())
            {
                while (done < n)
                {
                    byte[] a = new byte[v + ib.Length];
                    Buffer.BlockCopy(d, 0, a, 0, v);
                    Buffer.BlockCopy(ib, 0, a, v, ib.Length);
                    byte[] h = sha.ComputeHash(a);
                    for (int r = 1; r < Iterations; r++)
                    {
                        h = sha.ComputeHash(h);
                    }
                    int take = Math.Min(u, n - done);
                    Buffer.BlockCopy(h, 0, result, done, take);
                    done += take;
                    if (done >= n)
                    {
                        break;
                    }
                    byte[] b = Repeat(h, v);
                    for (int j = 0; j < ib.Length; j += v)
                    {
                        int carry = 1; // I_j = (I_j + B + 1) mod 2^(8v)
                        for (int k = v - 1; k >= 0; k--)
                        {
                            int sum = ib[j + k] + b[k] + carry;
                            ib[j + k] = (byte)sum;
                            carry = sum >> 8;
                        }
                    }
                }
            }
            return result;
        }

        private static byte[] Repeat(byte[] src, int len)
        {
            byte[] r = new byte[len];
            for (int i = 0; i < len && src.Length > 0; i++)
            {
                r[i] = src[i % src.Length];
            }
            return r;
        }
    }

    /// <summary>The few DER encodings PKCS#8 and PKCS#12 need.</summary>
    internal static class Der
    {
        internal static byte[] Sequence(params byte[][] items)
        {
            return Tlv(0x30, Concat(items));
        }

        internal static byte[] Set(params byte[][] items)
        {
            return Tlv(0x31, Concat(items));
        }

        internal static byte[] OctetString(byte[] b)
        {
            return Tlv(0x04, b);
        }

        internal static byte[] Null()
        {
            return new byte[] { 0x05, 0x00 };
        }

        internal static byte[] Explicit(int tag, byte[] content)
        {
            return Tlv((byte)(0xA0 | tag), content);
        }

        internal static byte[] Integer(long v)
        {
            var bytes = new List<byte>();
            do
            {
                bytes.Insert(0, (byte)v);
                v >>= 8;
            }
            while (v != 0);
            if ((bytes[0] & 0x80) != 0)
            {
                bytes.Insert(0, 0);
            }
            return Tlv(0x02, bytes.ToArray());
        }

        internal static byte[] Oid(string dotted)
        {
            string[] parts = dotted.Split('.');
            var body = new List<byte> { (byte)(int.Parse(parts[0]) * 40 + int.Parse(parts[1])) };
            for (int i = 2; i < parts.Length; i++)
            {
                long n = long.Parse(parts[i]);
                var chunk = new List<byte> { (byte)(n & 0x7F) };
                n >>= 7;
                while (n > 0)
                {
                    chunk.Insert(0, (byte)(0x80 | (n & 0x7F)));
                    n >>= 7;
                }
                body.AddRange(chunk);
            }
            return Tlv(0x06, body.ToArray());
        }

        internal static byte[] Tlv(byte tag, byte[] content)
        {
            var ms = new MemoryStream();
            ms.WriteByte(tag);
            int len = content.Length;
            if (len < 0x80)
            {
                ms.WriteByte((byte)len);
            }
            else
            {
                var lb = new List<byte>();
                while (len > 0)
                {
                    lb.Insert(0, (byte)len);
                    len >>= 8;
                }
                ms.WriteByte((byte)(0x80 | lb.Count));
                ms.Write(lb.ToArray(), 0, lb.Count);
            }
            ms.Write(content, 0, content.Length);
            return ms.ToArray();
        }

        private static byte[] Concat(byte[][] items)
        {
            var ms = new MemoryStream();
            foreach (byte[] i in items)
            {
                ms.Write(i, 0, i.Length);
            }
            return ms.ToArray();
        }

        /// <summary>Reads DER TLVs in order.</summary>
        internal sealed class Reader
        {
            private readonly byte[] _b;
            private int _at;

            internal Reader(byte[] b)
            {
                _b = b;
            }

            internal bool HasMore => _at < _b.Length;

            internal byte PeekTag()
            {
                if (_at >= _b.Length)
                {
                    throw new ArgumentException("truncated DER");
                }
                return _b[_at];
            }

            /// <summary>Reads one TLV with this tag and returns its content.</summary>
            internal byte[] Read(byte tag)
            {
                return ReadContent(tag);
            }

            /// <summary>Reads one TLV with this tag and returns it whole (tag and length included).</summary>
            internal byte[] ReadTlv(byte tag)
            {
                int start = _at;
                ReadContent(tag);
                byte[] r = new byte[_at - start];
                Buffer.BlockCopy(_b, start, r, 0, r.Length);
                return r;
            }

            private byte[] ReadContent(byte tag)
            {
                if (_at + 2 > _b.Length || _b[_at] != tag)
                {
                    throw new ArgumentException("malformed DER: expected tag 0x" + tag.ToString("x2"));
                }
                _at++;
                int len = _b[_at++];
                if (len >= 0x80)
                {
                    int n = len & 0x7F;
                    if (n == 0 || n > 3 || _at + n > _b.Length)
                    {
                        throw new ArgumentException("malformed DER length");
                    }
                    len = 0;
                    for (int i = 0; i < n; i++)
                    {
                        len = (len << 8) | _b[_at++];
                    }
                }
                if (_at + len > _b.Length)
                {
                    throw new ArgumentException("truncated DER");
                }
                byte[] c = new byte[len];
                Buffer.BlockCopy(_b, _at, c, 0, len);
                _at += len;
                return c;
            }
        }
    }
}
