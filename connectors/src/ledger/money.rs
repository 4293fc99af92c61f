//! The ledger's business rules, without I/O: whether a money request may move money on an
//! account, and the balance it leaves. The store runs them inside the request's transaction.

use super::model::{Account, Kind, MoneyRequest};

/// A definitive refusal: nothing was committed, and the same request will be refused again
/// until the account changes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Rejection {
    #[error("account {account_id} does not exist")]
    UnknownAccount { account_id: String },
    #[error("account {account_id} belongs to another tenant than {tenant_id}")]
    TenantMismatch {
        account_id: String,
        tenant_id: String,
    },
    #[error("account {account_id} holds {account} but the amount is in {request}")]
    CurrencyMismatch {
        account_id: String,
        account: String,
        request: String,
    },
    #[error("account {account_id} holds {balance} minor units, the debit needs {amount}")]
    InsufficientFunds {
        account_id: String,
        balance: i64,
        amount: i64,
    },
    #[error("the balance of account {account_id} would leave the 64-bit range")]
    BalanceOutOfRange { account_id: String },
}

impl Rejection {
    /// The stable error code clients match on.
    pub fn code(&self) -> &'static str {
        match self {
            Rejection::UnknownAccount { .. } => "unknown_account",
            Rejection::TenantMismatch { .. } => "tenant_mismatch",
            Rejection::CurrencyMismatch { .. } => "currency_mismatch",
            Rejection::InsufficientFunds { .. } => "insufficient_funds",
            Rejection::BalanceOutOfRange { .. } => "balance_out_of_range",
        }
    }
}

/// The balance `request` leaves on `account` (None: the account does not exist), or why it
/// may not move money.
pub fn apply(
    account: Option<&Account>,
    kind: Kind,
    request: &MoneyRequest,
) -> Result<i64, Rejection> {
    let Some(account) = account else {
        return Err(Rejection::UnknownAccount {
            account_id: request.account_id.clone(),
        });
    };
    if account.tenant_id != request.tenant_id {
        return Err(Rejection::TenantMismatch {
            account_id: account.account_id.clone(),
            tenant_id: request.tenant_id.clone(),
        });
    }
    if account.currency != request.amount.currency {
        return Err(Rejection::CurrencyMismatch {
            account_id: account.account_id.clone(),
            account: account.currency.clone(),
            request: request.amount.currency.clone(),
        });
    }
    let amount = request.amount.minor_units;
    let out_of_range = || Rejection::BalanceOutOfRange {
        account_id: account.account_id.clone(),
    };
    match kind {
        Kind::Debit if account.balance_minor < amount => Err(Rejection::InsufficientFunds {
            account_id: account.account_id.clone(),
            balance: account.balance_minor,
            amount,
        }),
        Kind::Debit => account
            .balance_minor
            .checked_sub(amount)
            .ok_or_else(out_of_range),
        Kind::Refund => account
            .balance_minor
            .checked_add(amount)
            .ok_or_else(out_of_range),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ledger::model::Amount;

    fn account(balance: i64) -> Account {
        Account {
            tenant_id: "acme".into(),
            account_id: "acc_1".into(),
            currency: "EUR".into(),
            balance_minor: balance,
        }
    }

    fn request(tenant: &str, minor: i64, currency: &str) -> MoneyRequest {
        MoneyRequest {
            tenant_id: tenant.into(),
            account_id: "acc_1".into(),
            amount: Amount {
                minor_units: minor,
                currency: currency.into(),
            },
            reference: "txn_1".into(),
            reason: None,
        }
    }

    #[test]
    fn debits_take_money_out_and_refunds_put_it_back() {
        let acc = account(1_000);
        assert_eq!(
            apply(Some(&acc), Kind::Debit, &request("acme", 400, "EUR")),
            Ok(600)
        );
        assert_eq!(
            apply(Some(&acc), Kind::Debit, &request("acme", 1_000, "EUR")),
            Ok(0)
        );
        assert_eq!(
            apply(Some(&acc), Kind::Refund, &request("acme", 400, "EUR")),
            Ok(1_400)
        );
    }

    #[test]
    fn refusals_say_why() {
        let acc = account(100);
        let code = |account: Option<&Account>, kind, req: MoneyRequest| {
            apply(account, kind, &req).map_err(|r| r.code())
        };
        assert_eq!(
            code(None, Kind::Refund, request("acme", 1, "EUR")),
            Err("unknown_account")
        );
        assert_eq!(
            code(Some(&acc), Kind::Refund, request("other", 1, "EUR")),
            Err("tenant_mismatch")
        );
        assert_eq!(
            code(Some(&acc), Kind::Refund, request("acme", 1, "USD")),
            Err("currency_mismatch")
        );
        assert_eq!(
            code(Some(&acc), Kind::Debit, request("acme", 101, "EUR")),
            Err("insufficient_funds")
        );
        assert_eq!(
            code(
                Some(&account(i64::MAX)),
                Kind::Refund,
                request("acme", 1, "EUR")
            ),
            Err("balance_out_of_range")
        );
    }
}
