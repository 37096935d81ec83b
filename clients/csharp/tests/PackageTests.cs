using System.Collections.Generic;
using System.IO;
using NUnit.Framework;
using Ticketing.Tools;

namespace Ticketing.Tests
{
    /// <summary>
    /// The package check of tools/PackageCheck.cs (package.sh runs it too): Ticketing.csproj has the
    /// metadata the registry needs, packs the README and LICENSE, and compiles exactly the sources
    /// that build.sh compiled for these tests (build/library-sources.txt).
    /// </summary>
    [TestFixture]
    public class PackageTests
    {
        [Test]
        public void CsprojIsReadyToPackAndCompilesWhatMonoCompiled()
        {
            string client = Path.Combine(Env.RepoRoot, "clients", "csharp");
            List<string> metadata;
            List<string> problems = PackageCheck.Problems(client, Env.RepoRoot, Path.Combine(client, "build", "library-sources.txt"), out metadata);
            Assert.IsEmpty(problems, string.Join("\n", problems));
            CollectionAssert.Contains(metadata, "Version: " + File.ReadAllText(Path.Combine(Env.RepoRoot, "VERSION")).Trim());
            CollectionAssert.Contains(metadata, "PackageLicenseExpression: Apache-2.0");
        }

        [Test]
        public void TheMonoBuildCarriesTheCsprojVersion()
        {
            string version = File.ReadAllText(Path.Combine(Env.RepoRoot, "VERSION")).Trim();
            System.Reflection.Assembly a = typeof(TicketingClient).Assembly;
            Assert.AreEqual(version, a.GetName().Version.ToString(3));
            var info = (System.Reflection.AssemblyInformationalVersionAttribute)System.Attribute.GetCustomAttribute(a, typeof(System.Reflection.AssemblyInformationalVersionAttribute));
            Assert.AreEqual(version, info.InformationalVersion);
        }

        [Test]
        public void CheckFindsASourceTheCsprojWouldCompileButMonoDidNot()
        {
            string client = Path.Combine(Env.RepoRoot, "clients", "csharp");
            string list = Path.Combine(Path.GetTempPath(), "csharp-pkgcheck-" + System.Guid.NewGuid().ToString("N") + ".txt");
            try
            {
                var lines = new List<string>(File.ReadAllLines(Path.Combine(client, "build", "library-sources.txt")));
                string dropped = lines[lines.Count - 1];
                lines.RemoveAt(lines.Count - 1);
                lines.Add("src/Ticketing/NotThere.cs");
                File.WriteAllLines(list, lines);
                List<string> metadata;
                List<string> problems = PackageCheck.Problems(client, Env.RepoRoot, list, out metadata);
                CollectionAssert.Contains(problems, dropped + " is compiled by the .csproj but not by the Mono build");
                CollectionAssert.Contains(problems, "src/Ticketing/NotThere.cs is compiled by the Mono build but not by the .csproj");
            }
            finally
            {
                File.Delete(list);
            }
        }
    }
}
