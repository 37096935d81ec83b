# frozen_string_literal: true

module Ticketing
  # The gem's version.
  VERSION = "1.0.0"
end
