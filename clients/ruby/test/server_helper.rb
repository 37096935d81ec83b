# frozen_string_literal: true

require "tmpdir"
require "fileutils"
require "socket"
require "openssl"
require_relative "test_helper"

# Starts the real server binary ($TICKETING_BIN, or built once from the repository root) on
# 127.0.0.1 with a free port and a fresh data directory, and stops it by PID.
class TicketingServer
  attr_reader :port, :pid, :data_dir

  def self.binary
    @binary ||= begin
      bin = ENV["TICKETING_BIN"].to_s
      if bin.empty?
        dir = Dir.mktmpdir("ticketing-bin")
        at_exit { FileUtils.rm_rf(dir) }
        bin = File.join(dir, "ticketing")
        ok = system("go", "build", "-o", bin, "./cmd/ticketing", chdir: TestHelper::REPO_ROOT)
        raise "go build ./cmd/ticketing failed" unless ok
      end
      bin
    end
  end

  def initialize(env = {})
    @env = { "TICKETING_STARTUP_GRACE" => "0" }.merge(env)
    @data_dir = Dir.mktmpdir("ticketing-data")
    @port = nil
    start
  end

  def endpoint
    "127.0.0.1:#{@port}"
  end

  # Starts (or restarts, on the same port and data dir) the server; waits for "msg=listening".
  def start(extra_env = {})
    env = @env.merge(extra_env).merge("TICKETING_ADDR" => "127.0.0.1:#{@port || 0}", "TICKETING_DATA_DIR" => @data_dir)
    reader, writer = IO.pipe
    @pid = Process.spawn(env, TicketingServer.binary, "server", out: File::NULL, err: writer)
    writer.close
    @log = +""
    deadline = TestHelper.now + 15
    until (m = @log.match(/msg=listening .*addr=127\.0\.0\.1:(\d+)/))
      raise "server did not start:\n#{@log}" if TestHelper.now > deadline || !alive?
      raise "server did not start:\n#{@log}" unless reader.wait_readable([deadline - TestHelper.now, 0.1].max)

      begin
        @log << reader.readpartial(4096)
      rescue EOFError
        raise "server exited:\n#{@log}"
      end
    end
    @port = Integer(m[1])
    @drain = Thread.new do
      loop { @log << reader.readpartial(4096) }
    rescue EOFError, IOError
      reader.close
    end
    self
  end

  def log
    @log.dup
  end

  def alive?
    Process.waitpid(@pid, Process::WNOHANG).nil?
  rescue Errno::ECHILD
    false
  end

  # Sends +signal+ and waits for the process to exit (SIGKILL after +timeout+).
  def stop(signal = "TERM", timeout: 10)
    return unless @pid

    begin
      Process.kill(signal, @pid)
    rescue Errno::ESRCH
      nil
    end
    deadline = TestHelper.now + timeout
    while TestHelper.now < deadline
      return reap if Process.waitpid(@pid, Process::WNOHANG)

      sleep 0.01
    end
    Process.kill("KILL", @pid)
    Process.waitpid(@pid)
    reap
  rescue Errno::ECHILD, Errno::ESRCH
    reap
  end

  def kill
    stop("KILL")
  end

  # Process.kill only queues the signal: wait until every thread of the server is stopped (state
  # T in /proc), or a request sent at once could still be answered.
  def pause
    Process.kill("STOP", @pid)
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 5
    loop do
      stats = Dir.glob("/proc/#{@pid}/task/*/stat").map { |f| File.read(f) rescue "" }
      break if stats.all? { |st| st[st.rindex(")").to_i + 2] =~ /[Tt]/ || st.empty? }
      raise "server #{@pid} did not stop after SIGSTOP" if Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline

      sleep 0.01
    end
  end

  def resume
    Process.kill("CONT", @pid)
  end

  def close
    if @pid
      begin
        Process.kill("CONT", @pid)
      rescue Errno::ESRCH
        nil
      end
      stop("KILL")
    end
    FileUtils.rm_rf(@data_dir)
  end

  private

  def reap
    @drain&.join(1)
    @pid = nil
  end
end

# A TCP proxy on 127.0.0.1 that the tests control: cut every connection (RST), or hold back the
# server's bytes.
class TestProxy
  attr_reader :port

  def initialize(target_port)
    @target_port = target_port
    @listener = TCPServer.new("127.0.0.1", 0)
    @port = @listener.addr[1]
    @mutex = Mutex.new
    @pairs = []
    @hold = false
    @thread = Thread.new { accept_loop }
  end

  def endpoint
    "127.0.0.1:#{@port}"
  end

  # While on, bytes from the server are held back (dropped when the connection is cut).
  def hold!(on = true)
    @mutex.synchronize { @hold = on }
  end

  # Cuts every proxied connection in both directions with a reset; new connections work.
  def cut
    pairs = @mutex.synchronize do
      @hold = false
      list = @pairs
      @pairs = []
      list
    end
    pairs.flatten.each do |sock|
      sock.setsockopt(Socket::SOL_SOCKET, Socket::SO_LINGER, [1, 0].pack("ii"))
      sock.close
    rescue IOError, SystemCallError
      nil
    end
  end

  def connections
    @mutex.synchronize { @pairs.size }
  end

  def close
    @listener.close
    cut
    @thread.join(1)
  end

  private

  def accept_loop
    loop do
      client = @listener.accept
      server = TCPSocket.new("127.0.0.1", @target_port)
      @mutex.synchronize { @pairs << [client, server] }
      Thread.new { pump(client, server, false) }
      Thread.new { pump(server, client, true) }
    end
  rescue IOError, SystemCallError
    nil
  end

  def pump(from, to, from_server)
    loop do
      data = from.readpartial(65_536)
      loop do
        break unless from_server && @mutex.synchronize { @hold }
        break if from.closed?

        sleep 0.005
      end
      to.write(data)
    end
  rescue IOError, SystemCallError, EOFError
    begin
      to.close
    rescue IOError, SystemCallError
      nil
    end
  end
end

# Test certificates made at test time: a CA, a server certificate for 127.0.0.1, a client one.
module TestCerts
  module_function

  def create(dir)
    ca_key = OpenSSL::PKey::EC.generate("prime256v1")
    ca = cert("CN=ticketing test CA", ca_key, nil, nil, ca: true)
    server_key = OpenSSL::PKey::EC.generate("prime256v1")
    server = cert("CN=127.0.0.1", server_key, ca, ca_key, san: "IP:127.0.0.1,DNS:localhost")
    client_key = OpenSSL::PKey::EC.generate("prime256v1")
    client = cert("CN=ruby client", client_key, ca, ca_key, client: true)
    files = {
      ca: ["ca.pem", ca.to_pem], server_cert: ["server.pem", server.to_pem], server_key: ["server.key", server_key.to_pem],
      client_cert: ["client.pem", client.to_pem], client_key: ["client.key", client_key.to_pem]
    }
    files.transform_values do |(name, pem)|
      path = File.join(dir, name)
      File.write(path, pem)
      path
    end
  end

  def cert(subject, key, issuer, issuer_key, ca: false, san: nil, client: false)
    c = OpenSSL::X509::Certificate.new
    c.version = 2
    c.serial = rand(1 << 62)
    c.subject = OpenSSL::X509::Name.parse(subject)
    c.issuer = issuer ? issuer.subject : c.subject
    c.public_key = key
    c.not_before = Time.now - 60
    c.not_after = Time.now + 3600
    ext = OpenSSL::X509::ExtensionFactory.new
    ext.subject_certificate = c
    ext.issuer_certificate = issuer || c
    if ca
      c.add_extension(ext.create_extension("basicConstraints", "CA:TRUE", true))
      c.add_extension(ext.create_extension("keyUsage", "keyCertSign,cRLSign", true))
    else
      c.add_extension(ext.create_extension("basicConstraints", "CA:FALSE", true))
      c.add_extension(ext.create_extension("keyUsage", "digitalSignature", true))
      c.add_extension(ext.create_extension("extendedKeyUsage", client ? "clientAuth" : "serverAuth", false))
      c.add_extension(ext.create_extension("subjectAltName", san, false)) if san
    end
    c.sign(issuer_key || key, OpenSSL::Digest.new("SHA256"))
    c
  end
end
