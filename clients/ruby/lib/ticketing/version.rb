# frozen_string_literal: true

module Ticketing
  # The gem's version: the project's one version (the repository's VERSION file).
  VERSION = "0.3.0"
end
