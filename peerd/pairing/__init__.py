"""Joining a fleet with consent: approval on a member, a one-time code, or a single-use invite.

* ``codes``    pure rules: the verification code both machines show, one-time codes, invite proofs
* ``crypto``   the fleet key sealed to a node key (PyNaCl), and the PAKE (``spake2``)
* ``desk``     a member's pending requests, codes and sessions: bounded, expiring, rate-limited (pure)
* ``grant``    what a member hands a machine it lets in: the fleet key and where to find the fleet
* ``host``     a member answering the unsealed ``POST /v1/join`` requests
* ``guest``    the joining machine's side of each flow

Invite tokens and the issuer's records of them are ``peerd.invite``; the wire of ``/v1/join`` is
``peerd.protocol.join``.

Invariants:
* Joining takes consent: a machine is let in only by a person's approval (both screens show the
  same verification code), a right one-time code (PAKE, confirmed both ways) or a valid
  single-use invite bound to the joiner's node key; a removed node is never let in again.
* The fleet key travels only encrypted, to the one machine let in; nothing else of the fleet
  but its public id and the member's name and public key is in any answer.
* Nothing is written to the joining home until the member's answer checked out, and a member's
  desk is bounded and expiring, so nothing a stranger sends can grow it.
* Every failure is a ``PairingError`` with a message for the person at the machine.
"""
