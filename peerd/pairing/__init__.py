"""Joining a fleet with consent: approval on a member, a one-time code, or a single-use invite.

* ``codes``    pure rules: the verification code both machines show, one-time codes, invite proofs
* ``crypto``   the fleet key sealed to a node key (PyNaCl), and the PAKE (``spake2``)
* ``desk``     a member's pending requests, codes and sessions: bounded, expiring, rate-limited (pure)
* ``invites``  invite tokens and the issuer's records of them (single use, expiring)
* ``host``     a member answering the unsealed ``POST /v1/join`` requests
* ``guest``    the joining machine's side of each flow

The wire of ``/v1/join`` is ``peerd.protocol.join``.
"""
